"""Finished requests' KV kept in their slots, so that a prompt that begins the same prefills only the rest.

A conversation's next turn is its last prompt, the reply, and something new. When a Thinker request
finishes, its slot is not freed but kept with the keys of the positions its KV holds; a new prompt
takes the entry with the longest common prefix (at least `min_tokens`, so that the few tokens every
prompt shares, a chat template's header, never move a conversation's slot or cost a copy) and
prefills only what follows. A match that covers the entry's prompt moves the slot to the new request (what is left
past it is that conversation's reply); a shorter one (one system prompt, many users) copies the
shared part into a free slot and leaves the entry for others. Kept slots are given back, least recently used first,
whenever a request needs a slot and none is free, so the cache only ever holds slots nobody else
wants. Anything that does not match prefills in full, as it would without the cache.

A position's key is its token id, except under an audio clip, where every position carries the
clip's digest (engine/prompt.py: a negative number no token id can equal): the same placeholders over other audio do
not match. A match never ends inside a clip, so a clip is encoded whole or not at all.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from engine.runners.kv_cache import SlotKVCache


def position_keys(token_ids: list[int], clip_spans: list[tuple[int, int]], clip_keys: list[int]) -> np.ndarray:
    keys = np.asarray(token_ids, dtype=np.int64).copy()
    for (a, b), key in zip(clip_spans, clip_keys, strict=True):
        keys[a:b] = key
    return keys


@dataclass(slots=True)
class Entry:
    slot: int
    keys: np.ndarray  # [n]: what positions 0..n-1 of the slot hold
    prompt_len: int  # of those, the prompt's; the rest is its reply
    embeds: torch.Tensor | None  # [p, H] layer-0 rows of the prompt that made it (p <= n), for the Talker
    hidden: torch.Tensor | None  # [p, H] its captured layer's rows; None when that request spoke no audio


@dataclass(frozen=True, slots=True)
class Reuse:
    slot: int
    length: int  # positions of the slot that hold the new prompt's prefix
    embeds: torch.Tensor | None  # [min(length, p), H] of those that were a prompt's
    hidden: torch.Tensor | None


class PrefixCache:
    """Owns the kept slots (of `kv`, outside its free list), most recently kept or used last."""

    def __init__(self, kv: SlotKVCache, *, min_tokens: int = 64) -> None:
        self.kv = kv
        self.min_tokens = min_tokens
        self.entries: OrderedDict[int, Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def num_free(self) -> int:
        """Slots a request can have now: free ones and kept ones."""
        return self.kv.num_free + len(self.entries)

    def allocate(self) -> int:
        if self.kv.num_free == 0:
            self.kv.free(self.entries.popitem(last=False)[1].slot)
        return self.kv.allocate()

    def keep(self, entry: Entry) -> None:
        self.entries[entry.slot] = entry

    def claim(self, keys: np.ndarray, clip_spans: list[tuple[int, int]], *, want_hidden: bool) -> Reuse | None:
        """A slot holding the longest cached prefix of a prompt with these keys, now the caller's; None
        when nothing long enough matches (allocate a slot and prefill it all)."""
        best, best_length = None, 0
        for entry in self.entries.values():
            if want_hidden and entry.hidden is None:
                continue
            n = min(len(entry.keys), len(keys) - 1)  # the last prompt position is always prefilled: its logits
            same = entry.keys[:n] == keys[:n]
            length = n if same.all() else int(np.argmin(same))
            if length > best_length:
                best, best_length = entry, length
        for a, b in clip_spans:  # never inside a clip
            if a < best_length < b:
                best_length = a
        if best is None or best_length < self.min_tokens:
            return None
        self.entries.move_to_end(best.slot)
        p = min(best_length, 0 if best.embeds is None else best.embeds.shape[0])
        embeds = None if best.embeds is None else best.embeds[:p]
        hidden = None if best.hidden is None else best.hidden[:p]
        # The slot moves to the new request when what it holds past the match is nobody else's: its
        # reply (a conversation's next turn re-tokenizes the reply text, which may part from the
        # tokens generated), or when no slot is free (a copy would push out another conversation's).
        if best_length >= best.prompt_len or self.kv.num_free == 0:
            del self.entries[best.slot]
            return Reuse(best.slot, best_length, embeds, hidden)
        slot = self.kv.allocate()
        for keys_, values in zip(self.kv.keys, self.kv.values, strict=True):
            keys_[slot, :, :best_length] = keys_[best.slot, :, :best_length]
            values[slot, :, :best_length] = values[best.slot, :, :best_length]
        return Reuse(slot, best_length, embeds, hidden)
