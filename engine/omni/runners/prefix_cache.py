"""Finished requests' KV kept in their slots, so that a prompt that begins the same prefills only the rest.

A finished Thinker request's slot is kept with the keys of its positions; a new prompt takes the entry with the
longest common prefix of at least `min_tokens` (a chat template's shared header never moves a slot) and prefills
the rest. A match covering the entry's prompt moves the slot to the new request; a shorter one (one system prompt,
many users) copies the shared part into a free slot and leaves the entry. `KEPT_PER_SLOT` kept slots sit beside
each request's, given back least recently used first whenever a request needs a slot or pages: the cache holds
only what nobody else wants. A kept slot given back moves its KV to a host pool (`host_bytes`, LRU), from which a
match is copied back instead of prefilled; on a GPU both copies are queued on the Thinker's stream, in pinned memory,
and its thread never waits for them. A kept prefix also holds the Talker's rows of its prompt, in pinned
host memory (on the GPU, outside the KV pool start-up sizes, a long call's rows would run a step out of memory),
as pieces copied to the host once each; a Talker copies back only the rows its own kept prefix lacks. A
position's key is its token id, except under an audio clip, where it is the clip's digest (negative, so no token
id equals it); a match never ends inside a clip, so a clip is encoded whole or not at all."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from engine.metrics import PrefixCacheMetrics
from engine.omni.runners.kept_slots import KeptSlots, PrefixIndex
from engine.omni.runners.kv_cache import SlotKVCache

# slots for kept prefixes per request slot: three listening conversations per running request keep their
# prefixes, as long as the pool has room for their pages
KEPT_PER_SLOT = 3


def position_keys(token_ids: list[int], media_spans: list[tuple[int, int]], media_keys: list[int]) -> np.ndarray:
    keys = np.asarray(token_ids, dtype=np.int64).copy()
    for (a, b), key in zip(media_spans, media_keys, strict=True):
        keys[a:b] = key
    return keys


Rows = tuple[torch.Tensor, ...]  # [n_i, H] pieces, end to end; on the host where a GPU runs the model


@dataclass(slots=True)
class Entry:
    slot: int
    keys: np.ndarray  # [n]: what positions 0..n-1 of the slot hold
    prompt_len: int  # of those, the prompt's; the rest is its reply
    embeds: Rows | None  # p layer-0 rows of the prompt that made it (p <= n), for the Talker, on the host
    hidden: Rows | None  # p of its captured layer's rows (host); None when that request spoke no audio


@dataclass(slots=True)
class HostEntry:
    """A kept prefix whose slot was given back: its KV, and the Talker's rows, in host memory."""

    keys: np.ndarray
    prompt_len: int
    embeds: Rows | None
    hidden: Rows | None
    kv: list[torch.Tensor]  # per layer, [2 (keys, values), kv heads, len(keys), head dim]
    nbytes: int  # what it holds, KV and rows


@dataclass(frozen=True, slots=True)
class Reuse:
    slot: int
    length: int  # positions of the slot that hold the new prompt's prefix
    embeds: Rows | None  # the first min(length, p) rows of those that were a prompt's, where the entry held them
    hidden: Rows | None


class PrefixCache(KeptSlots[Entry]):
    """Owns the kept slots (kept_slots.py) and the host pool, each most recently kept or used last."""

    def __init__(self, kv: SlotKVCache, metrics: PrefixCacheMetrics, *, min_tokens: int = 64,
                 host_bytes: int = 0) -> None:
        # a match shorter than `min_tokens` is never taken: blocks of that many find the candidates
        super().__init__(kv, metrics.kv_pages, "requests", min_tokens)
        self.metrics = metrics
        self.min_tokens = min_tokens
        self.host_bytes = host_bytes
        self.host: OrderedDict[int, HostEntry] = OrderedDict()  # by the count of moves there
        self._in_host: PrefixIndex[int] = PrefixIndex(min_tokens)
        self._moves = 0
        self._host_used = 0

    def __len__(self) -> int:
        return len(self.entries)

    def allocate(self) -> int:
        if self.kv.num_free == 0:
            self._evict()
        return self.kv.allocate()

    def reserve(self, slot: int, length: int, *, spare: int | None = None) -> bool:
        """Pages for positions [0, length) of `slot`, kept prefixes given up for them least recently used first
        (never `spare`'s); False when even that is not enough."""
        while not self.kv.reserve(slot, length):
            victims = [s for s in self.entries if s != spare]
            if not victims:
                return False
            self._evict(victims[0])
        return True

    def _evict(self, slot: int | None = None) -> None:
        """A kept prefix (by default the least recently used) to the host pool: its slot and pages free."""
        entry = self._take(next(iter(self.entries)) if slot is None else slot)
        self._to_host(entry)
        self.kv.free(entry.slot)

    def _to_host(self, entry: Entry) -> None:
        n = len(entry.keys)
        rows = sum(t.numel() * t.element_size() for pieces in (entry.embeds, entry.hidden) for t in pieces or ())
        nbytes = n * self.kv.position_bytes + rows
        if nbytes > self.host_bytes:  # the pool could not hold it: no copy at all
            self.metrics.evictions.labels("dropped").inc()
            return
        kv = [_to_pinned(self.kv.read(entry.slot, n, layer)) for layer in range(len(self.kv.keys))]
        moved = HostEntry(entry.keys, entry.prompt_len, entry.embeds, entry.hidden, kv, nbytes)
        self.metrics.evictions.labels("to_host").inc()
        self._moves += 1
        self._host_add(self._moves, moved)
        while self._host_used > self.host_bytes:
            self._host_take(next(iter(self.host)))
            self.metrics.evictions.labels("dropped").inc()
        self.metrics.host_bytes.set(self._host_used)

    def keep(self, entry: Entry) -> None:
        """A finished sequence's slot, holding `entry.keys`: the pages past them go back to the pool."""
        self.kv.trim(entry.slot, len(entry.keys))
        self._file(entry)

    def _host_add(self, key: int, entry: HostEntry) -> None:
        self.host[key] = entry
        self._in_host.add(key, entry.keys)
        self._host_used += entry.nbytes

    def _host_take(self, key: int) -> HostEntry:
        self._in_host.remove(key)
        entry = self.host.pop(key)
        self._host_used -= entry.nbytes
        return entry

    def claim(self, keys: np.ndarray, media_spans: list[tuple[int, int]], *, want_hidden: bool) -> Reuse | None:
        """The slot holding the longest cached prefix of these keys, now the caller's; None when none is long enough."""
        best: Entry | HostEntry | None = None
        best_key, best_length = 0, 0
        prompt = keys[:-1]  # the last prompt position is always prefilled: its logits
        in_slots = self._in_slots.longest(prompt, lambda s: self.entries[s].keys,
                                          lambda s: _has(self.entries[s], want_hidden))
        if in_slots is not None:
            best, best_key, best_length = self.entries[in_slots.name], in_slots.name, in_slots.length
        in_host = self._in_host.longest(prompt, lambda k: self.host[k].keys, lambda k: _has(self.host[k], want_hidden))
        if in_host is not None and in_host.length > best_length:
            best, best_key, best_length = self.host[in_host.name], in_host.name, in_host.length
        for a, b in media_spans:  # never inside a clip or an image
            if a < best_length < b:
                best_length = a
        if best is None or best_length < self.min_tokens:
            self.metrics.lookups.labels("miss").inc()
            return None
        if isinstance(best, HostEntry):
            self.metrics.lookups.labels("host").inc()
            return self._from_host(best_key, best, best_length)
        self.entries.move_to_end(best.slot)
        embeds, hidden = _rows(best, best_length)
        # The slot moves to the new request when what it holds past the match is nobody else's: its
        # reply (a conversation's next turn re-tokenizes the reply text, which may part from the
        # tokens generated), or when no slot is free (a copy would push out another conversation's).
        if best_length >= best.prompt_len or self.kv.num_free == 0:
            self._take(best.slot)
            self.metrics.lookups.labels("slot").inc()
            return Reuse(best.slot, best_length, embeds, hidden)
        slot = self.kv.allocate()
        if not self.reserve(slot, best_length, spare=best.slot):  # no room for a copy: a fresh prefill
            self.kv.free(slot)
            self.metrics.lookups.labels("miss").inc()
            return None
        self.kv.copy(best.slot, slot, best_length)
        self.metrics.lookups.labels("slot").inc()
        return Reuse(slot, best_length, embeds, hidden)

    def _from_host(self, key: int, entry: HostEntry, length: int) -> Reuse | None:
        """Copy a host entry's first `length` positions into a slot; the entry leaves the pool when the new
        prompt continues it (as a slot would move), and stays for others when they only share a part."""
        if length >= entry.prompt_len:
            self._host_take(key)
            self.metrics.host_bytes.set(self._host_used)
        else:
            self.host.move_to_end(key)
        slot = self.allocate()
        if not self.reserve(slot, length):  # the running sequences hold the pool: a fresh prefill, later
            self.kv.free(slot)
            if key not in self.host:
                self._host_add(key, entry)
                self.metrics.host_bytes.set(self._host_used)
            return None
        for layer, held in enumerate(entry.kv):
            on_device = held.to(self.kv.keys[layer].device, non_blocking=True)  # whole: a pinned copy stays queued
            self.kv.write(slot, layer, on_device[0, :, :length], on_device[1, :, :length])
        embeds, hidden = _rows(entry, length)
        return Reuse(slot, length, embeds, hidden)


def _has(entry: Entry | HostEntry, hidden: bool) -> bool:
    """Whether an entry can serve a prompt that wants (or not) the Talker's hidden rows."""
    return not hidden or entry.hidden is not None


def _rows(entry: Entry | HostEntry, length: int) -> tuple[Rows | None, Rows | None]:
    """The Talker's rows of the first `length` positions that were a prompt's."""
    return (None if entry.embeds is None else head(entry.embeds, length)), (
        None if entry.hidden is None else head(entry.hidden, length))


def head(pieces: Rows, n: int) -> Rows:
    """The first `n` rows of `pieces` (all of them if they hold fewer), as pieces: views, nothing copied."""
    out = []
    for piece in pieces:
        if n <= 0:
            break
        out.append(piece[:n])
        n -= piece.shape[0]
    return tuple(out)


def host_rows(pieces: list[torch.Tensor]) -> Rows | None:
    """Row pieces as the cache keeps them: those on the host as they are (unless a small view of a larger
    tensor); each run of GPU pieces copied into one pinned buffer without waiting (the copy back to a GPU runs
    on a stream that waits for this one). None for a request that made no rows (it spoke no audio)."""
    out: list[torch.Tensor] = []
    for on_gpu, group in itertools.groupby(pieces, key=lambda piece: piece.is_cuda):
        run = list(group)
        if on_gpu:
            out.append(_pinned(run))
        else:  # a step's rows on the CPU are views of the whole step's: kept, they would keep all of it
            out += [p.clone() if p.untyped_storage().nbytes() > 2 * p.nbytes else p for p in run]
    return tuple(out) or None


def _to_pinned(keys_values: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """One layer's keys and values of a kept prefix, [2, kv heads, n, head dim] on the host, copied without waiting:
    in pinned memory on a GPU, queued on the stream that writes the slot's pages next, so the pages can be given
    back at once and the Thinker's thread never waits for the step before it to end (a pageable copy would)."""
    keys, values = keys_values
    host = torch.empty((2, *keys.shape), dtype=keys.dtype, pin_memory=keys.is_cuda)
    host[0].copy_(keys, non_blocking=True)
    host[1].copy_(values, non_blocking=True)
    return host


def _pinned(run: list[torch.Tensor]) -> torch.Tensor:
    """GPU pieces end to end in one pinned host buffer, each copied without waiting."""
    host = torch.empty((sum(p.shape[0] for p in run), *run[0].shape[1:]), dtype=run[0].dtype, pin_memory=True)
    at = 0
    for piece in run:
        host[at : at + piece.shape[0]].copy_(piece, non_blocking=True)
        at += piece.shape[0]
    return host
