"""The paged KV cache (engine/omni/runners/kv_cache.py): slots take pages from one pool and give them back; what a
slot holds reads back from its pages wherever they lie."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.omni.runners.kv_cache import SlotKVCache


def cache(pages: int | None = None) -> SlotKVCache:
    return SlotKVCache(num_layers=2, num_slots=3, num_kv_heads=2, head_dim=4, max_len=40, dtype=torch.float32,
                       device="cpu", num_pages=pages, page_size=8)


def test_slots_take_pages_as_they_grow_and_give_them_back() -> None:
    kv = cache(pages=7)
    assert kv.pages_per_slot == 5 and kv.num_free_pages == 7 and kv.keys[0].shape == (8, 2, 8, 4)
    a, b = kv.allocate(), kv.allocate()
    assert kv.capacity(a) == 0 and kv.reserve(a, 17) and kv.capacity(a) == 24  # 3 pages
    assert kv.reserve(a, 10) and kv.capacity(a) == 24  # it holds them already
    assert not kv.reserve(b, 40) and kv.capacity(b) == 0  # 5 pages: only 4 free, and none is taken
    assert kv.reserve(b, 100) is False and kv.reserve(b, 32)  # past max_len asks for max_len
    assert kv.num_free_pages == 0 and set(kv.pages(a)) | set(kv.pages(b)) == set(range(7))
    kv.trim(b, 9)
    assert kv.capacity(b) == 16 and kv.num_free_pages == 2
    kv.free(a)
    assert kv.num_free_pages == 5 and kv.capacity(a) == 0 and a in kv.free_slots
    assert (kv.table[a] == kv.scratch_page).all() and (kv.table[b, 2:] == kv.scratch_page).all()


def test_what_a_slot_holds_reads_back_across_scattered_pages() -> None:
    kv = cache()
    kv.free_pages.reverse()  # page k of a slot lies anywhere
    for slot in range(3):
        kv.allocate()
        assert kv.reserve(slot, 20)
    keys, values = torch.randn(2, 20, 4), torch.randn(2, 20, 4)
    kv.write(1, 1, keys, values)
    assert all(torch.equal(x, y) for x, y in zip(kv.read(1, 20, 1), (keys, values), strict=True))
    kv.copy(1, 2, 13)
    read = kv.read(2, 13, 1)
    assert torch.equal(read[0], keys[:, :13]) and torch.equal(read[1], values[:, :13])
    pages = kv.locate(np.array([1, 1, 2]), np.array([0, 19, 12]))
    assert pages.tolist() == [kv.pages(1)[0], kv.pages(1)[2], kv.pages(2)[1]]
    assert kv.page_table([2, 0], pad_to=3).tolist()[2] == [kv.scratch_page] * 5


def test_a_pool_smaller_than_one_sequence_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot hold one sequence"):
        cache(pages=4)
