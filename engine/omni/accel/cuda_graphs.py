"""CUDA graphs: the Thinker's and the Talker's packed steps, per token bucket, and the Talker's 15-pass code
predictor, per batch bucket; decoder layers through torch.compile while the packed steps are captured.

Applied to finished runners from outside: `thinker_capture` / `talker_capture` are the `Capture` a runner is
built with (replay.py). Buckets are captured largest first into one shared memory pool; a step larger than
every bucket runs eagerly. Each graph family is captured on its own stream: cuBLAS bakes a workspace chosen
per capture stream into the graph, and stages replay concurrently on their own streams, so a shared capture
stream would let two stages' GEMMs write one workspace at once."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from engine.omni.runners.kv_cache import SlotKVCache
from engine.omni.runners.packed_batch import PackedAttention, PackedBatch, Piece
from engine.omni.runners.replay import EAGER, StepGraphs, capture
from engine.omni.runners.sampler import RowTensors
from engine.omni.runners.talker import TalkerRunner
from engine.omni.runners.thinker import ThinkerRunner

log = logging.getLogger(__name__)

G = TypeVar("G")

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


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
            graph, (codes, total) = capture(functools.partial(runner.predict_residuals, past_hidden, code0, rows),
                                            pool, capture_stream)
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


# Tokens of a packed step that graphs are captured for: every decode batch up to 64, then x1.5 steps
# (padding wastes at most a third of a step's rows) up to the step budget
PACKED_TOKENS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)

PackedStep = Callable[..., tuple[torch.Tensor, ...]]  # (embeds [T, H], batch[, deepstack [layers, T, H]])


@dataclass(slots=True)
class _PackedBucket:
    graph: torch.cuda.CUDAGraph
    embeds: torch.Tensor  # [T, H]
    batch: PackedBatch  # T tokens, one sequence per slot at most
    outputs: tuple[torch.Tensor, ...]  # per sequence [N, ...], then `per_token` outputs [T, ...]


class GraphedPacked:
    """Packed steps captured per token bucket: any mix of prompt pieces and decode rows whose tokens fit a bucket
    replays it; spare tokens write the KV cache's scratch page. Outputs are per sequence, then `per_token` per
    token. With `deepstack` layers a step also reads the rows images add in those layers, dense ([layers, T, H])."""

    def __init__(self, step: PackedStep, kv: SlotKVCache, attention: PackedAttention, hidden_size: int,
                 dtype: torch.dtype, tokens: tuple[int, ...], *, seqs: int, per_token: int, deepstack: int = 0) -> None:
        device = kv.keys[0].device
        self.per_token = per_token
        self.buckets: dict[int, _PackedBucket] = {}
        # one buffer for every bucket (each reads its first T rows); zeros between steps with images
        self.deepstack = torch.zeros(deepstack, max(tokens), hidden_size, device=device, dtype=dtype) if deepstack else None
        pool = None
        capture_stream = torch.cuda.Stream(device)
        for size in sorted(tokens, reverse=True):
            embeds = torch.zeros(size, hidden_size, device=device, dtype=dtype)
            # a bucket of T tokens holds at most T sequences: its small table no longer than that, so that
            # decode buckets of few rows split their keys (engine/omni/accel/packed_attention.py's `shares_for`)
            batch = PackedBatch.static(kv, attention, size, min(size, seqs))
            inputs = (embeds, batch) if self.deepstack is None else (embeds, batch, self.deepstack[:, :size])
            graph, outputs = capture(functools.partial(step, *inputs), pool, capture_stream)
            pool = graph.pool()
            self.buckets[size] = _PackedBucket(graph, embeds, batch, outputs)

    def __call__(self, embeds: torch.Tensor, pieces: list[Piece],
                 deepstack: torch.Tensor | None = None) -> tuple[torch.Tensor, ...] | None:
        n = embeds.shape[0]
        size = smallest_bucket(self.buckets, n)
        bucket = None if size is None else self.buckets[size]
        if bucket is None or len(pieces) > bucket.batch.seqs:
            return None
        bucket.embeds[:n].copy_(embeds)
        meta = torch.from_numpy(bucket.batch.layout(pieces))
        bucket.batch.meta.copy_(meta.to(bucket.batch.meta.device, non_blocking=True))
        images = None
        if deepstack is not None:
            assert self.deepstack is not None, "a step with images, replayed by graphs captured without their rows"
            images = self.deepstack[:, :n]
            images.copy_(deepstack)
        bucket.graph.replay()
        if images is not None:
            images.zero_()  # after the replay, in stream order: the next step without images reads zeros
        first_per_token = len(bucket.outputs) - self.per_token
        return tuple(out[: n if i >= first_per_token else len(pieces)].clone() for i, out in enumerate(bucket.outputs))


# A frame may compile anew for a bucket (one token or more, a small table that splits its keys or not, sizes
# that happen to be equal), and the Thinker's and the Talker's layers share frames (the attention class they
# both use, transformers' wrappers): torch's default of 8 runs out during the Talker's captures, and its
# smaller buckets (its decode steps) would be captured with those frames uncompiled.
RECOMPILE_LIMIT = 64


@contextlib.contextmanager
def compiled_layers(layers: torch.nn.ModuleList) -> Iterator[None]:
    """Each decoder layer through torch.compile while a stage's graphs are captured: a graphed step still runs every
    small kernel of its layers, and inductor fuses a layer's norms, rope, residuals and routing. All layers share
    one compiled function (the cache write, which would tell them apart, stays out: `PackedBatch.update`),
    compiled for one token and for any more. Only the captures call it, so nothing compiles while serving."""
    for layer in layers:
        layer.forward = torch.compile(layer.forward, dynamic=True)
    try:
        # a layer's `layer_idx` as a plain input, not a constant that would specialise each layer
        with torch._dynamo.config.patch(allow_unspec_int_on_nn_module=True, recompile_limit=RECOMPILE_LIMIT):
            yield
    finally:
        for layer in layers:
            del layer.forward  # back to the class's own


def _compiled(name: str, make: Callable[[], G], layers: torch.nn.ModuleList) -> G:
    try:
        with compiled_layers(layers):
            return make()
    except Exception:  # a compiler failure costs the fusion, not the graphs
        log.exception("%s: graphs with compiled layers failed; capturing them uncompiled", name)
    return make()


def _buckets(max_batch: int) -> tuple[int, ...]:
    return tuple(b for b in DEFAULT_BUCKETS if b < max_batch) + (max_batch,)


def _or_eager(name: str, capture_all: Callable[[], StepGraphs]) -> StepGraphs:
    """Graphs are an optimisation: a capture that fails leaves the stage eager, loudly."""
    try:
        with torch.inference_mode():
            return capture_all()
    except Exception:
        log.exception("%s: CUDA graph capture failed; this stage runs eagerly", name)
        return EAGER


def talker_capture(max_tokens: int) -> Callable[[TalkerRunner], StepGraphs]:
    """The Talker's code predictor per batch bucket and its packed steps of up to `max_tokens` rows, compiled."""

    def capture_all(runner: TalkerRunner) -> StepGraphs:
        def make() -> StepGraphs:
            predictor = GraphedCodePredictor(runner, _buckets(runner.max_batch))
            if not runner.attention.block_q:
                log.warning("talker: packed steps are not graphed without the attention kernel (kernels: triton)")
                return StepGraphs(predictor=predictor)
            hidden = runner.codec_embedding.embedding_dim
            packed = _compiled("talker", lambda: GraphedPacked(runner.packed_step, runner.kv, runner.attention, hidden,
                                                               runner.dtype, packed_tokens(max_tokens),
                                                               seqs=runner.max_batch, per_token=0),
                               runner.talker.model.layers)
            log.info("talker packed steps captured for %s rows", sorted(packed.buckets))
            return StepGraphs(packed=packed, predictor=predictor)

        return _or_eager("talker", make)

    return capture_all


def packed_tokens(max_tokens: int) -> tuple[int, ...]:
    return tuple(t for t in PACKED_TOKENS if t < max_tokens) + (max_tokens,)


def thinker_capture(max_tokens: int) -> Callable[[ThinkerRunner], StepGraphs]:
    """The Thinker's packed steps of up to `max_tokens` tokens, with compiled layers. A replay needs the
    attention kernel, which reads its work list from the device (the reference reads the host's pieces):
    without it the Thinker runs eagerly."""

    def capture_all(runner: ThinkerRunner) -> StepGraphs:
        if not runner.attention.block_q:
            log.warning("thinker: packed steps are not graphed without the attention kernel (kernels: triton)")
            return EAGER

        def make() -> StepGraphs:
            hidden = runner.text_model.embed_tokens.embedding_dim
            tokens = packed_tokens(max_tokens)
            packed = _compiled("thinker", lambda: GraphedPacked(runner.packed_step, runner.kv, runner.attention, hidden,
                                                                runner.dtype, tokens, seqs=runner.max_batch, per_token=1,
                                                                deepstack=runner.deepstack_layers),
                               runner.text_model.layers)
            log.info("thinker packed steps captured for %s tokens", sorted(packed.buckets))
            return StepGraphs(packed=packed)

        return _or_eager("thinker", make)

    return capture_all
