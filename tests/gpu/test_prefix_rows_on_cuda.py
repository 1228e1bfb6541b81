"""A kept prefix's Talker rows on a GPU: they wait in host memory, copied there without waiting for the step that
made them, and come back to the GPU with the prompt that reuses them, whole (the GPU lane; skipped without CUDA)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from engine.metrics import PrefixCacheMetrics
from engine.runners.kv_cache import SlotKVCache
from engine.runners.prefix_cache import Entry, PrefixCache, host_rows

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_kept_rows_wait_on_the_host_and_come_back_whole() -> None:
    kv = SlotKVCache(num_layers=1, num_slots=2, num_kv_heads=1, head_dim=4, max_len=256, dtype=torch.bfloat16,
                     device="cuda", page_size=16)
    cache = PrefixCache(kv, PrefixCacheMetrics(CollectorRegistry()), min_tokens=4)
    tokens = list(range(10, 170))
    stream = torch.cuda.Stream()
    with torch.inference_mode(), torch.cuda.stream(stream):
        slot = cache.allocate()
        assert cache.reserve(slot, len(tokens))
        torch.cuda._sleep(100_000_000)  # the step that makes the rows is still running when they are kept
        pieces = [torch.randn(n, 2048, device="cuda", dtype=torch.bfloat16) for n in (64, 64, 32)]
        expected = torch.cat(pieces)
        cache.keep(Entry(slot, np.asarray(tokens), len(tokens), host_rows(pieces), host_rows([-p for p in pieces])))
        entry = cache.entries[slot]
        assert entry.embeds is not None and entry.embeds.device.type == "cpu" and entry.embeds.is_pinned()
        del pieces
        reuse = cache.claim(np.asarray(tokens + [1, 2]), [], want_hidden=True)
        assert reuse is not None and reuse.embeds is not None and reuse.hidden is not None
        assert reuse.embeds.is_cuda and reuse.length == len(tokens)
        stream.synchronize()
    torch.testing.assert_close(reuse.embeds, expected, rtol=0, atol=0)
    torch.testing.assert_close(reuse.hidden, -expected, rtol=0, atol=0)
