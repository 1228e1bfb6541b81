"""Finished replies' Talker KV kept in their slots, so that a conversation's next turn prefills only its new rows.

The Talker's prompt is every user turn's rows of the Thinker's prompt, then the assistant part. A conversation's
next Thinker prompt begins with its last one, so the user rows the Talker prefilled last turn are this turn's
first rows; a long call would otherwise prefill its whole history in the Talker every turn. A Talker row at
Thinker position p depends on the Thinker's prompt up to p alone, so a kept slot's rows hold for a new prompt as
far as the two Thinker prompts agree. A kept slot holds the pages of its user rows alone; kept slots are given
back, least recently used first, whenever a reply needs a slot or pages and none are free; a match moves the slot
to the new reply, whose prompt overwrites what it holds past the match."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from prometheus_client import Counter, Gauge

from engine.omni.runners.kept_slots import KeptSlots
from engine.omni.runners.kv_cache import SlotKVCache


@dataclass(slots=True)
class KeptRows:
    slot: int
    keys: np.ndarray  # the Thinker prompt's position keys (engine/omni/runners/prefix_cache.py) that made it
    row_ends: np.ndarray  # per user row the slot holds, in order: the Thinker position just past it


@dataclass(frozen=True, slots=True)
class TalkerReuse:
    slot: int
    rows: int  # of the new prompt's user rows, those the slot holds already


def user_row_ends(user_spans: tuple[tuple[int, int], ...]) -> np.ndarray:
    """Per user row of a Talker prompt, the Thinker position just past it."""
    if not user_spans:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(a + 1, b + 1, dtype=np.int64) for a, b in user_spans])


class TalkerPrefixCache(KeptSlots[KeptRows]):
    """Owns the kept slots (engine/omni/runners/kept_slots.py). `rows`: the Talker's prompt rows, by whether a kept slot
    held them (cached) or a step prefilled them; `pages`: the KV pool's pages by holder (replies, kept, free)."""

    def __init__(self, kv: SlotKVCache, rows: Counter, pages: Gauge, *, min_rows: int = 32) -> None:
        # `min_rows` user rows end `min_rows` Thinker positions in at least: blocks of that many find the candidates
        super().__init__(kv, pages, "replies", min_rows)
        self.rows = rows
        self.min_rows = min_rows

    def allocate(self) -> int:
        if self.kv.num_free == 0:
            self._give_back_oldest()
        return self.kv.allocate()

    def _give_back_oldest(self) -> None:
        self.kv.free(self._take(next(iter(self.entries))).slot)

    def reserve(self, slot: int, rows: int) -> bool:
        """Pages for rows [0, rows) of `slot`, kept slots given up for them least recently used first; False
        (and no kept slot given up) when even all of them would not do."""
        if self.kv.pages_for(rows) - int(self.kv.held[slot]) > self.kv.num_free_pages + self._kept_pages():
            return False
        while not self.kv.reserve(slot, rows):
            self._give_back_oldest()
        return True

    def keep(self, entry: KeptRows) -> None:
        if len(entry.row_ends) < self.min_rows:
            self.kv.free(entry.slot)
            return
        self.kv.trim(entry.slot, len(entry.row_ends))
        self._file(entry)

    def claim(self, keys: np.ndarray, row_ends: np.ndarray) -> TalkerReuse | None:
        """The kept slot holding the most of a new prompt's user rows, now the caller's; None when no slot
        holds `min_rows` of them. The prompt's last user row is always prefilled (so is its assistant part)."""
        match = self._in_slots.longest(keys, lambda slot: self.entries[slot].keys)
        if match is None:
            return None
        best = self.entries[match.name]
        # the rows that end where the prompts still agree, less the prompt's last: most where they agree longest
        best_rows = min(int(np.searchsorted(best.row_ends, match.length, side="right")), len(row_ends) - 1)
        if best_rows < self.min_rows:
            return None
        self._take(best.slot)
        self.rows.labels("cached").inc(best_rows)
        return TalkerReuse(best.slot, best_rows)
