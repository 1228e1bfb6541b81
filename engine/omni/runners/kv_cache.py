"""A paged KV cache for continuous batching over transformers' attention layers.

Each request holds a slot from its first prompt piece to its finish; a slot holds pages of `page_size`
positions out of one pool shared by all slots, taken as its positions are written (the stages reserve a
prompt's and its longest reply's when it starts). Memory follows what the conversations hold rather than
`num_slots x max_len`: the pool (`num_pages`) is the budget, and a slot can still grow to `max_len`. A forward
goes through a packed batch (packed_batch.py), which the attention layers call as their `cache`; it carries each
sequence's page list, so nothing on the device changes when pages move."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch

# positions per page: a multiple of the attention kernel's key block (64), so no block of keys spans two
# pages; a slot wastes half a page on average (12 MiB of the Thinker's KV)
PAGE_SIZE = 256


def cache_kwarg(module: torch.nn.Module) -> str:
    """transformers renamed `past_key_values` to `cache` (5.2x); accept both releases."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


class SlotKVCache:
    """Owns the K/V pages ([pages + 1, kv heads, page_size, head dim] per layer; the last page is scratch,
    where padding writes), the slots' page lists and the free lists of slots and pages. `num_pages`: the
    pool; by default every slot's `max_len` (no sharing)."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
        num_pages: int | None = None,
        page_size: int = PAGE_SIZE,
    ) -> None:
        self.page_size = page_size
        self.pages_per_slot = -(-max_len // page_size)
        num_pages = num_slots * self.pages_per_slot if num_pages is None else num_pages
        if num_pages < self.pages_per_slot:
            raise ValueError(f"{num_pages} pages of {page_size} cannot hold one sequence of {max_len} positions")
        shape = (num_pages + 1, num_kv_heads, page_size, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_len = max_len
        self.num_slots = num_slots
        self.num_pages = num_pages
        self.scratch_page = num_pages
        self.free_slots = list(range(num_slots - 1, -1, -1))
        self.free_pages = list(range(num_pages - 1, -1, -1))
        # each slot's pages, `held[slot]` of them, the scratch page past them: what a step's layout reads
        self.table = np.full((num_slots, self.pages_per_slot), self.scratch_page, dtype=np.int64)
        self.held = np.zeros(num_slots, dtype=np.int64)

    @classmethod
    def for_decoder(cls, config: Any, *, max_batch: int, max_len: int, dtype: torch.dtype, device: torch.device | str,
                    pool_positions: int = 0, kept_slots: int = 0) -> SlotKVCache:
        """The cache of a transformers decoder with `config`: a slot for each of `max_batch` sequences and `kept_slots`
        more for kept prefixes (prefix_cache.py); `pool_positions`: the pool's size (0: `max_batch` x `max_len`)."""
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        num_pages = -(-pool_positions // PAGE_SIZE) if pool_positions else max_batch * -(-max_len // PAGE_SIZE)
        return cls(num_layers=config.num_hidden_layers, num_slots=max_batch + kept_slots,
                   num_kv_heads=config.num_key_value_heads, head_dim=head_dim, max_len=max_len, dtype=dtype,
                   device=device, num_pages=num_pages)

    @property
    def position_bytes(self) -> int:
        return sum(2 * keys[0, :, 0].numel() * keys.element_size() for keys in self.keys)

    @property
    def num_free(self) -> int:
        return len(self.free_slots)

    @property
    def num_free_pages(self) -> int:
        return len(self.free_pages)

    def pages_for(self, length: int) -> int:
        return -(-min(length, self.max_len) // self.page_size)

    def allocate(self) -> int:
        """A slot with no pages yet (`reserve` gives it room)."""
        return self.free_slots.pop()

    def free(self, slot: int) -> None:
        assert slot not in self.free_slots, f"slot {slot} freed twice"
        self.trim(slot, 0)
        self.free_slots.append(slot)

    def capacity(self, slot: int) -> int:
        return int(self.held[slot]) * self.page_size

    def pages(self, slot: int) -> list[int]:
        return self.table[slot, : self.held[slot]].tolist()

    def reserve(self, slot: int, length: int) -> bool:
        """Pages for positions [0, min(length, max_len)) of `slot`; False (nothing taken) when the pool is short."""
        need = self.pages_for(length) - int(self.held[slot])
        if need > len(self.free_pages):
            return False
        for _ in range(max(need, 0)):
            self.table[slot, self.held[slot]] = self.free_pages.pop()
            self.held[slot] += 1
        return True

    def trim(self, slot: int, length: int) -> None:
        while self.held[slot] > self.pages_for(length):
            self.held[slot] -= 1
            self.free_pages.append(int(self.table[slot, self.held[slot]]))
            self.table[slot, self.held[slot]] = self.scratch_page

    def locate(self, slots: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Per (slot, position), the page that holds it (its offset there: the position modulo `page_size`)."""
        return self.table[slots, positions // self.page_size]

    def page_table(self, slots: np.ndarray | list[int], pad_to: int = 0) -> np.ndarray:
        """[max(len(slots), pad_to), pages_per_slot]: each slot's pages, then the scratch page (in padding rows too)."""
        table = np.full((max(len(slots), pad_to), self.pages_per_slot), self.scratch_page, dtype=np.int64)
        table[: len(slots)] = self.table[np.asarray(slots, dtype=np.int64)]
        return table

    def _index(self, slot: int, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        assert n <= self.capacity(slot), (slot, n, self.capacity(slot))
        positions = np.arange(n)
        pages = self.locate(np.full(n, slot), positions)
        return torch.from_numpy(pages).to(device), torch.from_numpy(positions % self.page_size).to(device)

    def read(self, slot: int, n: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values of positions [0, n) of `slot` in `layer`, [kv heads, n, head dim] each (copies)."""
        page, offset = self._index(slot, n, self.keys[layer].device)
        return self.keys[layer][page, :, offset].transpose(0, 1), self.values[layer][page, :, offset].transpose(0, 1)

    def write(self, slot: int, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Positions [0, n) of `slot` in `layer` from keys/values [kv heads, n, head dim] (its pages reserved)."""
        page, offset = self._index(slot, keys.shape[1], self.keys[layer].device)
        self.keys[layer][page, :, offset] = keys.transpose(0, 1).to(self.keys[layer].device)
        self.values[layer][page, :, offset] = values.transpose(0, 1).to(self.values[layer].device)

    def copy(self, source: int, target: int, n: int) -> None:
        """Positions [0, n) of slot `source` into slot `target`, every layer (its pages reserved)."""
        device = self.keys[0].device
        (src_page, src_offset), (dst_page, dst_offset) = self._index(source, n, device), self._index(target, n, device)
        for keys, values in zip(self.keys, self.values, strict=True):
            keys[dst_page, :, dst_offset] = keys[src_page, :, src_offset]
            values[dst_page, :, dst_offset] = values[src_page, :, src_offset]
