"""CUDA graphs for the Talker's code predictor: its 15 dependent passes captured once per batch bucket.

Applied to a finished `TalkerRunner` from outside (the model and the eager path
stay as they are). Each bucket's graph reads static input tensors; a call copies
its rows in, replays the smallest bucket that fits, and reads the outputs back.
Buckets are captured largest first into one shared memory pool. A batch larger
than every bucket runs eagerly. The eager path is the reference the graphed one
is tested against.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from engine.models.sampler import RowTensors
from engine.models.talker_runner import TalkerRunner

log = logging.getLogger(__name__)

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(slots=True)
class _Bucket:
    graph: torch.cuda.CUDAGraph
    past_hidden: torch.Tensor  # [B, H]
    code0: torch.Tensor  # [B]
    rows: RowTensors  # [B] each
    codes: torch.Tensor  # [B, num_code_groups] output
    total: torch.Tensor  # [B, H] output


class GraphedCodePredictor:
    """Owns the captured graphs and their static tensors."""

    def __init__(self, runner: TalkerRunner, buckets: tuple[int, ...] = DEFAULT_BUCKETS) -> None:
        self.runner = runner
        self.buckets: dict[int, _Bucket] = {}
        pool = None
        hidden = runner.codec_embedding.embedding_dim
        for size in sorted(buckets, reverse=True):
            past_hidden = torch.zeros(size, hidden, device=runner.device, dtype=runner.dtype)
            code0 = torch.zeros(size, dtype=torch.long, device=runner.device)
            rows = RowTensors(
                temperature=torch.ones(size, device=runner.device),
                top_p=torch.ones(size, device=runner.device),
                top_k=torch.zeros(size, dtype=torch.long, device=runner.device),
                seeds=torch.arange(size, dtype=torch.long, device=runner.device),
                draws=torch.zeros(size, dtype=torch.long, device=runner.device),
            )
            # warm up on a side stream so lazy initialisation stays out of the capture
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    runner.predict_residuals(past_hidden, code0, rows)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                codes, total = runner.predict_residuals(past_hidden, code0, rows)
            pool = graph.pool()
            self.buckets[size] = _Bucket(graph, past_hidden, code0, rows, codes, total)
        log.info("code predictor captured for batch sizes %s", sorted(self.buckets))

    def __call__(
        self, past_hidden: torch.Tensor, code0: torch.Tensor, rows: RowTensors
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Replay the smallest bucket that fits; None when the batch is larger than every bucket."""
        n = past_hidden.shape[0]
        size = min((b for b in self.buckets if b >= n), default=None)
        if size is None:
            return None
        bucket = self.buckets[size]
        bucket.past_hidden[:n].copy_(past_hidden)
        bucket.code0[:n].copy_(code0)
        for name in ("temperature", "top_p", "top_k", "seeds", "draws"):
            getattr(bucket.rows, name)[:n].copy_(getattr(rows, name))
        bucket.graph.replay()
        return bucket.codes[:n].clone(), bucket.total[:n].clone()


def apply_cuda_graphs(runner: TalkerRunner, buckets: tuple[int, ...] = DEFAULT_BUCKETS) -> None:
    runner.graphed_predictor = GraphedCodePredictor(runner, buckets)
