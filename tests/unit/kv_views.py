"""What a runner's paged KV cache holds, as the step tests read it: a slot's rows, the scratch page, and
whether a page no slot holds was written."""

from __future__ import annotations

import torch

from engine.omni.runners.kv_cache import SlotKVCache


def kv_rows(kv: SlotKVCache, slot: int, n: int) -> list[torch.Tensor]:
    """Every layer's keys, then every layer's values, of positions [0, n) of `slot`."""
    held = [kv.read(slot, n, layer) for layer in range(len(kv.keys))]
    return [k for k, _ in held] + [v for _, v in held]


def scratch_rows(kv: SlotKVCache) -> list[torch.Tensor]:
    """The scratch page of every layer, where padding writes."""
    return [k[kv.scratch_page].clone() for k in kv.keys] + [v[kv.scratch_page].clone() for v in kv.values]


def untouched(kv: SlotKVCache) -> bool:
    """No page that no slot holds was written."""
    free = torch.tensor(kv.free_pages, dtype=torch.long)
    return all(not t[free].any() for t in (*kv.keys, *kv.values))
