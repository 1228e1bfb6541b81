"""Which kept prefixes share the most of a prompt's first blocks, so that a prompt is compared position by position
only with those, not with every kept prefix.

A kept prefix is filed under a chained digest of each of its whole blocks of positions (a block's digest covers
every position before it, as vLLM's prefix cache hashes its blocks). A prompt walks its own blocks' digests
while some eligible prefix holds them; the holders at the deepest block are its candidates, and nothing that
matches fewer whole blocks can match longer. A match shorter than one block is never wanted: the caches ask
for at least one block's worth.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

import numpy as np

K = TypeVar("K", bound=Hashable)


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
        best: list[K] = []
        for digest in self._walk(keys):
            found = [name for name in self._holders.get(digest, ()) if eligible(name)]
            if not found:
                break
            best = found
        return best
