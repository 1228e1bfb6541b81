"""CUDA graphs: decode steps (Thinker, Talker) and the Talker's 15-pass code predictor, per batch bucket;
one-prompt prefills (Thinker, Talker), per prompt-length bucket.

Applied to finished runners from outside (the model and the eager path stay as
they are). Each bucket's graph reads static input tensors; a call copies
its rows in, replays the smallest bucket that fits, and reads the outputs back.
Buckets are captured largest first into one shared memory pool. A batch larger
than every bucket runs eagerly. Each graph family is captured on its own stream:
cuBLAS bakes a workspace chosen per capture stream into the graph, and stages
replay their graphs concurrently on their own streams, so one shared capture
stream would let two stages' GEMMs write the same workspace at once. The eager
path is the reference the graphed one is tested against.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.models.kv_cache import SlotBatch, SlotKVCache
from engine.models.sampler import RowTensors
from engine.models.talker_runner import TalkerRunner
from engine.models.thinker_runner import ThinkerRunner

log = logging.getLogger(__name__)

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def capture(fn: Callable[[], Any], pool: Any, stream: torch.cuda.Stream) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Run `fn` twice on a side stream (lazy initialisation stays out of the graph), then capture
    it on `stream` into `pool`; returns the graph and the outputs its replays overwrite."""
    side = torch.cuda.Stream(stream.device)
    side.wait_stream(torch.cuda.current_stream(stream.device))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(stream.device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        outputs = fn()
    return graph, outputs


def smallest_bucket(buckets: dict[int, Any], size: int) -> int | None:
    return min((b for b in buckets if b >= size), default=None)


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
        capture_stream = torch.cuda.Stream()
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
            graph, (codes, total) = capture(lambda: runner.predict_residuals(past_hidden, code0, rows), pool,
                                            capture_stream)
            pool = graph.pool()
            self.buckets[size] = _Bucket(graph, past_hidden, code0, rows, codes, total)
        log.info("code predictor captured for batch sizes %s", sorted(self.buckets))

    def __call__(
        self, past_hidden: torch.Tensor, code0: torch.Tensor, rows: RowTensors
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Replay the smallest bucket that fits; None when the batch is larger than every bucket."""
        n = past_hidden.shape[0]
        size = smallest_bucket(self.buckets, n)
        if size is None:
            return None
        bucket = self.buckets[size]
        bucket.past_hidden[:n].copy_(past_hidden)
        bucket.code0[:n].copy_(code0)
        for name in ("temperature", "top_p", "top_k", "seeds", "draws"):
            getattr(bucket.rows, name)[:n].copy_(getattr(rows, name))
        bucket.graph.replay()
        return bucket.codes[:n].clone(), bucket.total[:n].clone()


DecodeStep = Callable[[torch.Tensor, SlotBatch], tuple[torch.Tensor, ...]]


@dataclass(slots=True)
class _DecodeBucket:
    graph: torch.cuda.CUDAGraph
    embeds: torch.Tensor  # [B, 1, H]
    slots: torch.Tensor  # [B]
    starts: torch.Tensor  # [B]
    outputs: tuple[torch.Tensor, ...]


class GraphedDecode:
    """One decode step (one token per slot) of a slot-KV model, captured per batch bucket.

    A graph cannot change shape, so it attends over the cache's whole length (the mask hides
    what is not written yet) and its padding rows write into the cache's scratch slot.
    """

    def __init__(self, step: DecodeStep, kv: SlotKVCache, hidden_size: int, dtype: torch.dtype,
                 buckets: tuple[int, ...]) -> None:
        device = kv.keys[0].device
        self.kv = kv
        self.buckets: dict[int, _DecodeBucket] = {}
        pool = None
        capture_stream = torch.cuda.Stream(device)
        for size in sorted(buckets, reverse=True):
            embeds = torch.zeros(size, 1, hidden_size, device=device, dtype=dtype)
            slots = torch.full((size,), kv.scratch_slot, dtype=torch.long, device=device)
            starts = torch.zeros(size, dtype=torch.long, device=device)
            view = SlotBatch(cache=kv, slots=slots, starts=starts, num_new=1, kv_len=kv.max_len)
            graph, outputs = capture(lambda: step(embeds, view), pool, capture_stream)
            pool = graph.pool()
            self.buckets[size] = _DecodeBucket(graph, embeds, slots, starts, outputs)

    def __call__(self, embeds: torch.Tensor, slots: list[int], positions: list[int]) -> tuple[torch.Tensor, ...] | None:
        n = embeds.shape[0]
        size = smallest_bucket(self.buckets, n)
        if size is None:
            return None
        bucket = self.buckets[size]
        bucket.embeds[:n].copy_(embeds)
        pad = size - n
        bucket.slots.copy_(torch.tensor(slots + [self.kv.scratch_slot] * pad).to(bucket.slots.device, non_blocking=True))
        bucket.starts.copy_(torch.tensor(positions + [0] * pad).to(bucket.starts.device, non_blocking=True))
        bucket.graph.replay()
        return tuple(out[:n].clone() for out in bucket.outputs)


PrefillStep = Callable[[torch.Tensor, SlotBatch, torch.Tensor], tuple[torch.Tensor, ...]]
PREFILL_BUCKETS = (32, 64, 128, 256, 512)


@dataclass(slots=True)
class _PrefillBucket:
    graph: torch.cuda.CUDAGraph
    embeds: torch.Tensor  # [1, L, H]
    slots: torch.Tensor  # [1]
    starts: torch.Tensor  # [1], always 0; held so its memory stays the graph's
    last: torch.Tensor  # [1] index of the prompt's last row
    outputs: tuple[torch.Tensor, ...]


class GraphedPrefill:
    """One prompt's prefill, captured per prompt-length bucket.

    An eager prefill is host-bound (the Thinker's 48 layers launch ~4000 kernels for ~15 ms of
    GPU work) and shares the host with the other stages' threads, which is what a lone
    request's first packet waits on. The prompt is right-padded to its bucket: every layer is
    causal, so padding rows change no real row, and the keys they write past the prompt are
    overwritten by decode before any query sees them.
    """

    def __init__(self, step: PrefillStep, kv: SlotKVCache, hidden_size: int, dtype: torch.dtype,
                 buckets: tuple[int, ...] = PREFILL_BUCKETS) -> None:
        device = kv.keys[0].device
        self.buckets: dict[int, _PrefillBucket] = {}
        pool = None
        capture_stream = torch.cuda.Stream(device)
        for size in sorted((b for b in buckets if b <= kv.max_len), reverse=True):
            embeds = torch.zeros(1, size, hidden_size, device=device, dtype=dtype)
            slots = torch.full((1,), kv.scratch_slot, dtype=torch.long, device=device)
            last = torch.zeros(1, dtype=torch.long, device=device)
            # every tensor a graph reads must outlive it: a freed one's memory is handed out again
            starts = torch.zeros(1, dtype=torch.long, device=device)
            view = SlotBatch(cache=kv, slots=slots, starts=starts, num_new=size, kv_len=size)
            graph, outputs = capture(lambda: step(embeds, view, last), pool, capture_stream)
            pool = graph.pool()
            self.buckets[size] = _PrefillBucket(graph, embeds, slots, starts, last, outputs)

    def takes(self, lengths: list[int], groups: bool) -> bool:
        """Whether prompts of these lengths run as one replay each: one prompt, or a group when
        `groups` (graph_prefill_groups), and every prompt within a bucket."""
        return (len(lengths) == 1 or groups) and all(smallest_bucket(self.buckets, n) is not None for n in lengths)

    def __call__(self, embeds: torch.Tensor, slot: int) -> tuple[torch.Tensor, ...] | None:
        """embeds [1, n, H] into `slot` -> the step's outputs; None when n exceeds every bucket."""
        n = embeds.shape[1]
        size = smallest_bucket(self.buckets, n)
        if size is None:
            return None
        bucket = self.buckets[size]
        bucket.embeds[:, :n].copy_(embeds)
        bucket.slots.fill_(slot)
        bucket.last.fill_(n - 1)
        bucket.graph.replay()
        return tuple(out.clone() for out in bucket.outputs)


def _buckets(max_batch: int) -> tuple[int, ...]:
    return tuple(b for b in DEFAULT_BUCKETS if b < max_batch) + (max_batch,)


def apply_talker_graphs(runner: TalkerRunner, prefill: bool = False) -> None:
    buckets = _buckets(runner.kv.num_slots)
    runner.graphed_predictor = GraphedCodePredictor(runner, buckets)
    hidden = runner.codec_embedding.embedding_dim
    runner.graphed_decode = GraphedDecode(runner.decode_step, runner.kv, hidden, runner.dtype, buckets)
    log.info("talker decode captured for batch sizes %s", sorted(buckets))
    if not prefill:
        return
    runner.graphed_prefill = GraphedPrefill(runner.prefill_step, runner.kv, hidden, runner.dtype)
    log.info("talker prefill captured for prompt lengths %s", sorted(runner.graphed_prefill.buckets))


def apply_thinker_graphs(runner: ThinkerRunner, prefill: bool = False) -> None:
    buckets = _buckets(runner.kv.num_slots)
    hidden = runner.text_model.embed_tokens.embedding_dim
    runner.graphed_decode = GraphedDecode(runner.decode_step, runner.kv, hidden, runner.dtype, buckets)
    log.info("thinker decode captured for batch sizes %s", sorted(buckets))
    if not prefill:
        return
    runner.graphed_prefill = GraphedPrefill(runner.prefill_step, runner.kv, hidden, runner.dtype)
    log.info("thinker prefill captured for prompt lengths %s", sorted(runner.graphed_prefill.buckets))
