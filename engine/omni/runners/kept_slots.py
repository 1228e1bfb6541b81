"""What the Thinker's and the Talker's prefix caches share: a paged KV cache's slots kept after their sequences
finished, in the order they were kept or used, the index of the positions they hold (engine/omni/runners/prefix_index.py),
and their count of the pool's pages.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, Protocol, TypeVar

import numpy as np
from prometheus_client import Gauge

from engine.omni.runners.kv_cache import SlotKVCache
from engine.omni.runners.prefix_index import PrefixIndex


class Kept(Protocol):
    slot: int
    keys: np.ndarray  # what the slot's positions hold, by position key (engine/omni/runners/prefix_cache.py)


E = TypeVar("E", bound=Kept)


class KeptSlots(Generic[E]):
    """Owns the kept slots of `kv` (outside its free list), least recently kept or used first. `pages`: the pool's
    pages by holder (`busy`, the running sequences' label; kept; free); `block`: the index's block, no longer than
    the shortest match a cache takes."""

    def __init__(self, kv: SlotKVCache, pages: Gauge, busy: str, block: int) -> None:
        self.kv = kv
        self.pages = pages
        self.busy = busy
        self.entries: OrderedDict[int, E] = OrderedDict()
        self._in_slots: PrefixIndex[int] = PrefixIndex(block)

    @property
    def num_free(self) -> int:
        """Slots a sequence can have now: free ones and kept ones."""
        return self.kv.num_free + len(self.entries)

    def _file(self, entry: E) -> None:
        self.entries[entry.slot] = entry
        self._in_slots.add(entry.slot, entry.keys)

    def _take(self, slot: int) -> E:
        self._in_slots.remove(slot)
        return self.entries.pop(slot)

    def _kept_pages(self) -> int:
        return int(self.kv.held[list(self.entries)].sum())

    def can_hold(self, length: int) -> bool:
        """Whether a new sequence of `length` positions can have its pages, kept slots given up for them."""
        return self.kv.pages_for(length) <= self.kv.num_free_pages + self._kept_pages()

    def count_pages(self) -> None:
        kept = self._kept_pages()
        free = self.kv.num_free_pages
        for holder, n in ((self.busy, self.kv.num_pages - kept - free), ("kept", kept), ("free", free)):
            self.pages.labels(holder).set(n)
