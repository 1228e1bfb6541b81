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


def test_a_prefix_given_back_to_the_host_pool_comes_back_whole() -> None:
    """One slot: a kept prefix is given back for the next request while the step that wrote it is still running;
    its KV goes to pinned host memory without waiting, the new request overwrites the pages at once, and the
    prefix copied back later into a slot is the one that was kept, to the bit."""
    kv = SlotKVCache(num_layers=2, num_slots=1, num_kv_heads=2, head_dim=64, max_len=512, dtype=torch.bfloat16,
                     device="cuda", page_size=16)
    cache = PrefixCache(kv, PrefixCacheMetrics(CollectorRegistry()), min_tokens=4, host_bytes=1 << 30)
    tokens = list(range(10, 310))
    stream = torch.cuda.Stream()
    with torch.inference_mode(), torch.cuda.stream(stream):
        slot = cache.allocate()
        assert cache.reserve(slot, len(tokens))
        torch.cuda._sleep(100_000_000)  # the step that writes the prefix is still running when it is kept
        kept = [(torch.randn(2, len(tokens), 64, device="cuda", dtype=torch.bfloat16),
                 torch.randn(2, len(tokens), 64, device="cuda", dtype=torch.bfloat16)) for _ in range(2)]
        for layer, (keys, values) in enumerate(kept):
            kv.write(slot, layer, keys, values)
        cache.keep(Entry(slot, np.asarray(tokens), len(tokens), None, None))
        other = cache.allocate()  # the only slot: the kept prefix goes to the host pool
        assert other == slot and not cache.entries and len(cache.host) == 1
        (entry,) = cache.host.values()
        assert all(layer.is_pinned() for layer in entry.kv)
        assert cache.reserve(other, len(tokens))
        for layer in range(2):  # the next request writes the same pages
            kv.write(other, layer, torch.zeros(2, len(tokens), 64, device="cuda", dtype=torch.bfloat16),
                     torch.zeros(2, len(tokens), 64, device="cuda", dtype=torch.bfloat16))
        kv.free(other)
        reuse = cache.claim(np.asarray(tokens + [1, 2]), [], want_hidden=False)
        assert reuse is not None and reuse.length == len(tokens)
        back = [kv.read(reuse.slot, len(tokens), layer) for layer in range(2)]
        stream.synchronize()
    for (keys, values), (got_keys, got_values) in zip(kept, back, strict=True):
        torch.testing.assert_close(got_keys, keys, rtol=0, atol=0)
        torch.testing.assert_close(got_values, values, rtol=0, atol=0)
