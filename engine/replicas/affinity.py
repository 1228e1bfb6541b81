"""Which replica each recent prompt ran on, so that a conversation's next turn goes where its KV is kept.

A conversation's next turn (a realtime session's, or a chat client's that sends the whole history) is
its last prompt, the reply, and something new: its prompt begins with the last one. The engine keeps a
finished request's KV for exactly that (engine/omni/runners/prefix_cache.py), but only on the replica that
ran it. So the router looks for the longest kept prompt that the new one begins with, and sends the
turn to that replica. A prompt that merely shares a beginning with others (one system prompt, many
users) begins with no whole kept prompt of theirs, and goes to the least loaded replica.

What one server process kept, the others do not know: a chat client's turns may reach any of them.
A request that names its conversation (`EngineRequest.conversation`) therefore goes where every
process sends that name, by rendezvous hashing over the replicas that serve: the same one each time,
and when a replica leaves, only its conversations move.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from engine.handoff import AdmittedRequest


@dataclass(frozen=True, slots=True)
class _Kept:
    replica: int
    audio_keys: tuple[int, ...]  # the clips inside the prompt: a turn that begins with it holds them first


def rendezvous(conversation: str, serving: list[int]) -> int:
    """The replica of `serving` that every process picks for this conversation: the highest hash of the pair."""
    def weight(replica: int) -> bytes:
        return hashlib.blake2b(f"{replica}:{conversation}".encode(), digest_size=8).digest()

    return max(serving, key=weight)


class ConversationAffinity:
    """Owns the kept prompts (by the digest of their token ids), least recently kept first, at most
    `capacity` of them, and how many of each length there are."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._kept: OrderedDict[tuple[int, bytes], _Kept] = OrderedDict()  # (length, digest) -> where
        self._lengths: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, request: AdmittedRequest, replica: int) -> None:
        ids = np.asarray(request.token_ids, dtype=np.int64)
        key = (len(ids), hashlib.blake2b(ids.tobytes(), digest_size=16).digest())
        if key not in self._kept:
            self._lengths[key[0]] = self._lengths.get(key[0], 0) + 1
        self._kept[key] = _Kept(replica, tuple(request.audio_keys))
        self._kept.move_to_end(key)
        while len(self._kept) > self.capacity:
            (length, _), _ = self._kept.popitem(last=False)
            self._lengths[length] -= 1
            if not self._lengths[length]:
                del self._lengths[length]

    def replica_for(self, request: AdmittedRequest) -> int | None:
        """The replica of the longest kept prompt this one begins with (and is longer than), or None."""
        ids = np.asarray(request.token_ids, dtype=np.int64)
        # one pass over the ids: the digest of each kept length's prefix is a copy of the running hash
        running, at, best = hashlib.blake2b(digest_size=16), 0, None
        for length in sorted(n for n in self._lengths if n < len(ids)):
            running.update(ids[at:length].tobytes())
            at = length
            kept = self._kept.get((length, running.copy().digest()))
            if kept is not None and tuple(request.audio_keys[:len(kept.audio_keys)]) == kept.audio_keys:
                best = kept.replica
        return best
