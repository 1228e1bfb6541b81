"""Which replica each recent prompt ran on, so that a conversation's next turn goes where its KV is kept.

A conversation's next prompt begins with its last one, whose KV the replica that ran it keeps (prefix_cache.py).
So the router sends a turn to the replica of the longest kept prompt it begins with; a prompt that merely shares
a beginning (one system prompt, many users) begins with no whole kept prompt and goes to the least loaded. One
server process does not know what the others kept, so a request that names its conversation
(`EngineRequest.conversation`) goes where every process sends that name, by rendezvous hashing over the serving
replicas: the same one each time, and when a replica leaves, only its conversations move."""

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
    """Owns the kept prompts (by their ids' digest), least recently kept first, at most `capacity`, by length."""

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
