"""What a layer's attention costs decode rows over long contexts, by how many shares their keys are split into
(`voice-gateway kernels`).

The packed kernel runs one program per decode row and key/value head, so a few rows over a long context leave
most of the GPU idle; `splits` shares the keys among that many programs. Each call (the released Thinker's
heads: 32 query, 4 key/value, 128 dims; bf16; pages of 256) is timed over its CUDA graph's replays (the median,
CUDA events), with the bandwidth its key and value reads imply."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import numpy as np
import torch

from engine.omni.accel.packed_attention import BLOCK_Q, packed_attention
from engine.omni.runners.kv_cache import SlotKVCache
from engine.omni.runners.packed_batch import block_tables
from engine.omni.runners.replay import capture, median_replay_ms

HEADS, KV_HEADS, HEAD_DIM = 32, 4, 128
CONTEXTS = (512, 2048, 8192)
BATCHES = (1, 16, 32, 64)
SPLITS = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class AttentionTiming:
    batch: int  # decode rows
    context: int  # positions each row attends over
    splits: int
    call_us: float  # one layer's attention, replayed from its graph, the median replay
    gb_per_s: float  # the keys and values read over that time

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def measure(*, contexts: tuple[int, ...] = CONTEXTS, batches: tuple[int, ...] = BATCHES,
            splits: tuple[int, ...] = SPLITS, replays: int = 30, seed: int = 0) -> list[AttentionTiming]:
    """Every (batch, context, splits); needs a CUDA GPU (compiled Triton and graphs)."""
    if not torch.cuda.is_available():
        raise RuntimeError("timing attention needs a CUDA GPU")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    cache = SlotKVCache(num_layers=1, num_slots=max(batches), num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                        max_len=max(contexts), dtype=torch.bfloat16, device="cuda")
    for slot in range(max(batches)):
        assert cache.reserve(slot, max(contexts))
    cache.keys[0].normal_(generator=gen)
    cache.values[0].normal_(generator=gen)
    timings = []
    with torch.inference_mode():
        for batch in batches:
            query = torch.randn(batch, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
            for context in contexts:
                tables = _tables(cache, batch, context)
                read = batch * context * cache.position_bytes
                for n in splits:
                    pages, starts, q0s, lengths, small, big_seq, big_first = tables
                    call = functools.partial(packed_attention, query, cache.keys[0], cache.values[0], pages, starts,
                                             q0s, lengths, small, big_seq, big_first, HEAD_DIM**-0.5, splits=n)
                    graph, _ = capture(call, None, torch.cuda.Stream())
                    us = median_replay_ms(graph, replays) * 1e3
                    timings.append(AttentionTiming(batch, context, n, round(us, 1), round(read / us / 1e3, 1)))
                    del graph
    return timings


def _tables(cache: SlotKVCache, batch: int, context: int) -> tuple[torch.Tensor, ...]:
    """A step of `batch` decode rows, each the next position of a slot that holds `context - 1`: the page table,
    then per sequence its start, first query and query length, then the kernel's three block tables."""
    small, big_seq, big_first = block_tables([1] * batch, BLOCK_Q, batch, batch)
    pages = torch.tensor(cache.page_table(np.arange(batch)), device="cuda")
    ints = [torch.tensor(x, device="cuda", dtype=torch.int32)
            for x in ([context - 1] * batch, list(range(batch)), [1] * batch, small, big_seq, big_first)]
    return (pages, *ints)
