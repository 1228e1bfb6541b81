"""What the Thinker's and the Talker's prefix caches share: a paged KV cache's slots kept after their sequences
finished, in the order they were kept or used, their count of the pool's pages, and the index of the positions
they hold (`PrefixIndex`): which kept prefixes share the most of a prompt's first blocks, so that a prompt is
compared position by position only with those, not with every kept prefix.

A kept prefix is filed under a chained digest of each of its whole blocks (a block's digest covers every position
before it, as vLLM's prefix cache hashes its blocks). A prompt walks its blocks' digests while some eligible
prefix holds them; the holders at the deepest block are its candidates, and each is compared only past its shared
blocks (less than a block), so many conversations beside one long system prompt cost a block's compare each. The
caches never want a match shorter than a block. Only the winner is compared from its start, so that a digest
collision can shorten a match but never make a wrong one."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np
from prometheus_client import Gauge

from engine.omni.runners.kv_cache import SlotKVCache

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Match(Generic[K]):
    name: K
    length: int  # the positions it agrees with the prompt on, from the first


def agreement(kept: np.ndarray, keys: np.ndarray) -> int:
    n = min(len(kept), len(keys))
    same = kept[:n] == keys[:n]
    return n if same.all() else int(np.argmin(same))


class PrefixIndex(Generic[K]):
    """Owns the digests of what each kept prefix (named by `K`, e.g. its slot) holds."""

    def __init__(self, block: int) -> None:
        self.block = block
        self._holders: dict[int, set[K]] = {}
        self._digests: dict[K, list[int]] = {}

    def _walk(self, keys: np.ndarray) -> Iterator[int]:
        digest = 0
        for start in range(0, len(keys) - self.block + 1, self.block):
            digest = hash((digest, keys[start : start + self.block].tobytes()))
            yield digest

    def add(self, name: K, keys: np.ndarray) -> None:
        digests = self._digests[name] = list(self._walk(keys))
        for digest in digests:
            self._holders.setdefault(digest, set()).add(name)

    def remove(self, name: K) -> None:
        for digest in self._digests.pop(name):
            holders = self._holders[digest]
            holders.discard(name)
            if not holders:
                del self._holders[digest]

    def candidates(self, keys: np.ndarray, eligible: Callable[[K], bool] = lambda _: True) -> list[K]:
        """The eligible prefixes that hold the most whole blocks of `keys`; none when not even the first."""
        return self._deepest(keys, eligible)[0]

    def longest(self, keys: np.ndarray, kept_keys: Callable[[K], np.ndarray],
                eligible: Callable[[K], bool] = lambda _: True) -> Match[K] | None:
        """The eligible prefix agreeing longest with `keys` (`kept_keys` gives what each holds); None when none
        holds even its first block."""
        names, blocks = self._deepest(keys, eligible)
        if not names:
            return None
        start = blocks * self.block
        tail = keys[start : start + self.block]  # no candidate agrees past it: none holds the next block
        windows = np.zeros((len(names), len(tail)), dtype=keys.dtype)
        lengths = np.zeros((len(names), 1), dtype=np.int64)
        for i, name in enumerate(names):  # one compare for all: many candidates share a long system prompt
            window = kept_keys(name)[start : start + len(tail)]
            windows[i, : len(window)] = window
            lengths[i] = len(window)
        differs = np.arange(len(tail) + 1) >= lengths  # past a window's end, and one column past the tail: apart
        differs[:, :-1] |= windows != tail
        best = names[int(differs.argmax(axis=1).argmax())]  # the first difference of each, the latest of those
        return Match(best, agreement(kept_keys(best), keys))

    def _deepest(self, keys: np.ndarray, eligible: Callable[[K], bool]) -> tuple[list[K], int]:
        """The eligible holders of the deepest block some eligible prefix holds, and how many blocks deep."""
        deepest: set[K] = set()
        depth = 0
        for digest in self._walk(keys):
            holders = self._holders.get(digest, set())
            if not any(eligible(name) for name in holders):  # one is enough to go deeper
                break
            deepest, depth = holders, depth + 1
        return [name for name in deepest if eligible(name)], depth


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
