"""A kept prefix's Talker rows on a GPU: they wait in host memory, copied there without waiting for the step that
made them; the prompt that reuses them gets them where they are (the Talker copies over what it lacks), and its
own entry keeps them as they are, copying only its new rows (the GPU lane; skipped without CUDA)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from engine.metrics import PrefixCacheMetrics
from engine.omni.runners.kv_cache import SlotKVCache
from engine.omni.runners.prefix_cache import Entry, PrefixCache, host_rows

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_kept_rows_wait_on_the_host_and_are_copied_there_once() -> None:
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
        assert entry.embeds is not None and len(entry.embeds) == 1  # one pinned buffer for the run of GPU pieces
        assert entry.embeds[0].device.type == "cpu" and entry.embeds[0].is_pinned()
        kept = entry.embeds[0]
        del pieces
        reuse = cache.claim(np.asarray(tokens + [1, 2]), [], want_hidden=True)
        assert reuse is not None and reuse.embeds is not None and reuse.hidden is not None
        assert reuse.length == len(tokens) and [p.data_ptr() for p in reuse.embeds] == [kept.data_ptr()]
        # the next turn's entry: the reused rows as they are, its own new rows copied to the host
        new = torch.randn(8, 2048, device="cuda", dtype=torch.bfloat16)
        rows = host_rows([*reuse.embeds, new])
        assert rows is not None and len(rows) == 2 and rows[0].data_ptr() == kept.data_ptr() and rows[1].is_pinned()
        stream.synchronize()
    torch.testing.assert_close(torch.cat(reuse.embeds), expected.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(torch.cat(reuse.hidden), -expected.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(rows[1], new.cpu(), rtol=0, atol=0)
