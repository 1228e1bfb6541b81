"""CUDA graphs: the Thinker's packed steps, per token bucket; the Talker's decode steps and 15-pass code
predictor, per batch bucket, and its prefills, per (prompts, prompt length) bucket; decoder layers through
torch.compile while the Thinker's steps and the Talker's decode steps are captured.

Applied to finished runners from outside: `thinker_capture` / `talker_capture` are the `Capture`
a runner is built with (engine/runners/replay.py); the model and the eager path stay as they are. Each bucket's graph reads static input tensors; a call copies
its rows in, replays the smallest bucket that fits, and reads the outputs back.
Buckets are captured largest first into one shared memory pool. A batch larger
than every bucket runs eagerly. Each graph family is captured on its own stream:
cuBLAS bakes a workspace chosen per capture stream into the graph, and stages
replay their graphs concurrently on their own streams, so one shared capture
stream would let two stages' GEMMs write the same workspace at once. The eager
path is the reference the graphed one is tested against.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from engine.runners.kv_cache import SlotBatch, SlotKVCache
from engine.runners.packed_batch import PackedAttention, PackedBatch, Piece
from engine.runners.replay import EAGER, StepGraphs, capture
from engine.runners.sampler import RowTensors
from engine.runners.talker import TalkerRunner
from engine.runners.thinker import ThinkerRunner

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
            graph, outputs = capture(functools.partial(step, embeds, view), pool, capture_stream)
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
# x1.5 steps, not x2: padding wastes at most a third of a prefill's rows, not half (a 44-token
# prompt pads to 48, not 64; 40 prompts to 48, not 64), for about three times the graphs
PREFILL_LENGTHS = (32, 48, 64, 96, 128, 192, 256, 384, 512)
PREFILL_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
GROUP_TOKENS = 4096  # the largest group graph: prompts x padded length
# The Talker's prompt is every user turn of the conversation, never cut in pieces: one-prompt graphs
# (and a few prompts where they fit GROUP_TOKENS) reach the longest prompt it can be given
LONG_LENGTHS = (768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
Shape = tuple[int, int]  # (prompts, padded length)


def plan_prefill(shapes: Iterable[Shape], lengths: list[int]) -> list[slice] | None:
    """A group of prompts as consecutive runs, one replay each, for graphs captured at these shapes;
    None when it runs eagerly (a prompt longer than every bucket, or a group when only one-prompt
    graphs exist)."""
    shapes = list(shapes)
    bucket = prefill_bucket(shapes, 1, lengths)
    if bucket is None:
        return None
    length = bucket[1]
    widest = max(b for b, n in shapes if n == length)
    if widest == 1 and len(lengths) > 1:
        return None  # one replay per prompt costs more than one eager forward (docs/performance.md)
    return [slice(i, i + widest) for i in range(0, len(lengths), widest)]


def prefill_bucket(shapes: Iterable[Shape], prompts: int, lengths: list[int]) -> Shape | None:
    """The smallest captured shape a run of `prompts` prompts of these lengths fits."""
    shapes = list(shapes)
    length = min((n for _, n in shapes if n >= max(lengths)), default=None)
    if length is None:
        return None
    size = min((b for b, n in shapes if n == length and b >= prompts), default=None)
    return None if size is None else (size, length)


@dataclass(slots=True)
class _PrefillBucket:
    graph: torch.cuda.CUDAGraph
    embeds: torch.Tensor  # [B, L, H]
    slots: torch.Tensor  # [B]
    starts: torch.Tensor  # [B] zeros, whole prompts: the graph reads them, so they live as long as it
    last: torch.Tensor  # [B] index of each prompt's last row
    outputs: tuple[torch.Tensor, ...]

    def load(self, embeds: torch.Tensor, slots: list[int], lengths: list[int], scratch: int) -> None:
        """A run's rows into the graph's inputs; the bucket's spare prompts write the scratch slot."""
        n, width = embeds.shape[0], max(lengths)
        # a run of a wider group arrives padded to the group's longest row; its own bucket may be shorter
        self.embeds[:n, :width].copy_(embeds[:, :width])
        pad = self.embeds.shape[0] - n
        self.slots.copy_(torch.tensor(slots + [scratch] * pad).to(self.slots.device, non_blocking=True))
        self.last.copy_(torch.tensor([k - 1 for k in lengths] + [0] * pad).to(self.last.device, non_blocking=True))


class GraphedPrefill:
    """Whole prompts (the Talker's) prefilled from graphs captured per (prompts, padded length) bucket.

    An eager prefill is host-bound: a stage's layers launch thousands of kernels for a few ms of
    GPU work, from a host the other stages' threads share. Replayed, a group costs its GPU time.
    Prompts are right-padded to the bucket's length and the group to its number of prompts: every
    layer is causal, so padding rows change no real row; padding prompts write into the cache's
    scratch slot, and the keys padding rows write past a prompt are overwritten by decode before any
    query sees them. With `batches=(1,)` only one-prompt prefills are captured.
    """

    def __init__(self, step: PrefillStep, kv: SlotKVCache, hidden_size: int, dtype: torch.dtype,
                 lengths: tuple[int, ...] = PREFILL_LENGTHS, batches: tuple[int, ...] = (1,),
                 max_tokens: int = GROUP_TOKENS) -> None:
        device = kv.keys[0].device
        self.kv = kv
        shapes = [(b, n) for b in batches for n in lengths if n <= kv.max_len and (b == 1 or b * n <= max_tokens)]
        self.buckets: dict[Shape, _PrefillBucket] = {}
        pool = None
        capture_stream = torch.cuda.Stream(device)
        for size, length in sorted(shapes, key=lambda s: -s[0] * s[1]):  # largest first into the pool
            embeds = torch.zeros(size, length, hidden_size, device=device, dtype=dtype)
            slots = torch.full((size,), kv.scratch_slot, dtype=torch.long, device=device)
            last = torch.zeros(size, dtype=torch.long, device=device)
            # every tensor a graph reads must outlive it: a freed one's memory is handed out again
            starts = torch.zeros(size, dtype=torch.long, device=device)
            view = SlotBatch(cache=kv, slots=slots, starts=starts, num_new=length, kv_len=length)
            graph, outputs = capture(functools.partial(step, embeds, view, last), pool, capture_stream)
            pool = graph.pool()
            self.buckets[size, length] = _PrefillBucket(graph, embeds, slots, starts, last, outputs)

    def plan(self, lengths: list[int]) -> list[slice] | None:
        return plan_prefill(self.buckets, lengths)

    def __call__(self, embeds: torch.Tensor, slots: list[int], lengths: list[int]) -> tuple[torch.Tensor, ...]:
        """Right-padded embeds [n, >= max(lengths), H] into `slots` -> the step's outputs for the n rows
        (per-row outputs as long as the bucket); the run must fit a bucket (`plan` says which do)."""
        n = embeds.shape[0]
        shape = prefill_bucket(self.buckets, n, lengths)
        assert shape is not None, (n, lengths)
        bucket = self.buckets[shape]
        bucket.load(embeds, slots, lengths, self.kv.scratch_slot)
        bucket.graph.replay()
        return tuple(out[:n].clone() for out in bucket.outputs)


# Tokens of a packed Thinker step that graphs are captured for: every decode batch up to 64, then x1.5
# steps (padding wastes at most a third of a step's rows) up to the step budget
PACKED_TOKENS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)

PackedStep = Callable[[torch.Tensor, PackedBatch], tuple[torch.Tensor, ...]]


@dataclass(slots=True)
class _PackedBucket:
    graph: torch.cuda.CUDAGraph
    embeds: torch.Tensor  # [T, H]
    batch: PackedBatch  # T tokens, one sequence per slot at most
    outputs: tuple[torch.Tensor, ...]  # per sequence [N, ...], then per token [T, ...]


class GraphedPacked:
    """Packed steps (engine/runners/packed_batch.py) captured per token bucket: any mix of prompt pieces and
    decode rows whose tokens fit a bucket replays it. Its spare tokens write the scratch slot."""

    def __init__(self, step: PackedStep, kv: SlotKVCache, attention: PackedAttention, hidden_size: int,
                 dtype: torch.dtype, tokens: tuple[int, ...]) -> None:
        device = kv.keys[0].device
        self.seqs = kv.num_slots  # a step holds each slot at most once
        self.buckets: dict[int, _PackedBucket] = {}
        pool = None
        capture_stream = torch.cuda.Stream(device)
        for size in sorted(tokens, reverse=True):
            embeds = torch.zeros(size, hidden_size, device=device, dtype=dtype)
            batch = PackedBatch.static(kv, attention, size, self.seqs)
            graph, outputs = capture(functools.partial(step, embeds, batch), pool, capture_stream)
            pool = graph.pool()
            self.buckets[size] = _PackedBucket(graph, embeds, batch, outputs)

    def __call__(self, embeds: torch.Tensor, pieces: list[Piece]) -> tuple[torch.Tensor, ...] | None:
        n = embeds.shape[0]
        size = smallest_bucket(self.buckets, n)
        if size is None or len(pieces) > self.seqs:
            return None
        bucket = self.buckets[size]
        bucket.embeds[:n].copy_(embeds)
        meta = torch.from_numpy(bucket.batch.layout(pieces))
        bucket.batch.meta.copy_(meta.to(bucket.batch.meta.device, non_blocking=True))
        bucket.graph.replay()
        logits, hidden = bucket.outputs
        return logits[: len(pieces)].clone(), hidden[:n].clone()


@contextlib.contextmanager
def compiled_layers(layers: torch.nn.ModuleList) -> Iterator[None]:
    """Each decoder layer through torch.compile while a stage's decode graphs are captured.

    A graphed decode step still runs every small kernel of its 20-48 layers (a Thinker step at
    batch 64: ~4600 kernels, half its GPU time outside the MoE kernels); inductor fuses the
    norms, rope, residuals and routing of a layer. All layers share one compiled function (the
    cache write, which would tell them apart, stays out of it: `SlotBatch.update`), compiled for
    batch 1 and for any larger batch. Only the captures call it, so nothing compiles while serving.
    """
    for layer in layers:
        layer.forward = torch.compile(layer.forward, dynamic=True)
    try:
        # a layer's `layer_idx` as a plain input, not a constant that would specialise each layer
        with torch._dynamo.config.patch(allow_unspec_int_on_nn_module=True):
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


def _prefill_batches(max_batch: int) -> tuple[int, ...]:
    return tuple(b for b in PREFILL_BATCHES if b < max_batch) + (max_batch,)


def _or_eager(name: str, capture_all: Callable[[], StepGraphs]) -> StepGraphs:
    """Graphs are an optimisation: a capture that fails leaves the stage eager, loudly."""
    try:
        with torch.inference_mode():
            return capture_all()
    except Exception:
        log.exception("%s: CUDA graph capture failed; this stage runs eagerly", name)
        return EAGER


def talker_capture(max_group: int) -> Callable[[TalkerRunner], StepGraphs]:
    """The Talker's code predictor, decode steps (compiled layers) and prefills of up to `max_group` prompts."""

    def capture_all(runner: TalkerRunner) -> StepGraphs:
        def make() -> StepGraphs:
            buckets = _buckets(runner.kv.num_slots)
            predictor = GraphedCodePredictor(runner, buckets)
            hidden = runner.codec_embedding.embedding_dim
            decode = _compiled(
                "talker", lambda: GraphedDecode(runner.decode_step, runner.kv, hidden, runner.dtype, buckets),
                runner.talker.model.layers)
            log.info("talker decode captured for batch sizes %s", sorted(buckets))
            lengths = tuple(sorted({*PREFILL_LENGTHS, *(n for n in LONG_LENGTHS if n < runner.kv.max_len), runner.kv.max_len}))
            prefill = GraphedPrefill(runner.prefill_step, runner.kv, hidden, runner.dtype, lengths=lengths,
                                     batches=_prefill_batches(min(max_group, runner.kv.num_slots)))
            log.info("talker prefill captured for (prompts, length, keys) %s", sorted(prefill.buckets))
            return StepGraphs(decode=decode, prefill=prefill, predictor=predictor)

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
                                                                runner.dtype, tokens), runner.text_model.layers)
            log.info("thinker packed steps captured for %s tokens", sorted(packed.buckets))
            return StepGraphs(packed=packed)

        return _or_eager("thinker", make)

    return capture_all
