"""Clip features that cross to the engine's process once, though a long call's requests name them every turn.

A realtime conversation's prompt holds every earlier turn's audio, so each turn's request carries the
features of all of them: by turn 80 of a call, 80 clips of 4 s, 16 MB, ~16 ms between two processes on a
2-core CPU, for features the engine reads only past its cached prefix. Passed as tensors, each also kept a
file descriptor open in both processes for as long as either held it (torch shares a tensor's memory
through one), so a server process that held thousands of clips' features held thousands of descriptors.

Now a server process sends a clip's features once (`SentClips`, per connection) and names it by its key
after; the engine's process holds what it was sent (`HeldClips`, one for all its connections), in its own
memory, longer than any server process counts on. Should it have let a named clip go anyway, it asks for
that request whole (`Resend`), and the server process sends it with every clip's features.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import torch

from engine.handoff import AdmittedRequest

SENT_CLIP_BYTES = 256 << 20  # what a server process counts on its engine holding (80 turns of ~16 calls)
HELD_CLIP_BYTES = 2 << 30  # what an engine's process holds: eight server processes' counts


class SentClips:
    """The clips a server process sent on one connection lately, by key, oldest first, within a byte budget."""

    def __init__(self, budget: int = SENT_CLIP_BYTES) -> None:
        self.budget = budget
        self._sent: OrderedDict[int, int] = OrderedDict()  # key -> bytes
        self._bytes = 0

    def strip(self, request: AdmittedRequest) -> AdmittedRequest:
        """The request as it crosses: features of clips sent lately left out (None), the others copied, so
        that sending never moves the server process's own features into shared memory."""
        features: list[torch.Tensor | None] = []
        for key, mel in zip(request.audio_keys, request.audio_features, strict=True):
            if key in self._sent:
                self._sent.move_to_end(key)
                features.append(None)
                continue
            self._sent[key] = mel.nbytes
            self._bytes += mel.nbytes
            features.append(mel.clone())
        while self._bytes > self.budget:
            self._bytes -= self._sent.popitem(last=False)[1]
        return dataclasses.replace(request, audio_features=features)  # type: ignore[arg-type]

    def forget(self, keys: list[int]) -> None:
        """The engine no longer holds these: they cross again with the next request that names them."""
        for key in keys:
            self._bytes -= self._sent.pop(key, 0)

    def clear(self) -> None:
        """A new connection: its engine holds nothing yet."""
        self._sent.clear()
        self._bytes = 0


class HeldClips:
    """The features an engine's process was sent, by key, least recently named first, within a byte budget."""

    def __init__(self, budget: int = HELD_CLIP_BYTES) -> None:
        self.budget = budget
        self._held: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._bytes = 0

    def fill(self, request: AdmittedRequest) -> AdmittedRequest | None:
        """The request with every clip's features, those it names by key from the ones held; None when it
        names one no longer held (then it must come whole)."""
        features: list[torch.Tensor] = []
        for key, mel in zip(request.audio_keys, request.audio_features, strict=True):
            if mel is None:
                if (held := self._held.get(key)) is None:
                    return None
                self._held.move_to_end(key)
                features.append(held)
                continue
            if key not in self._held:
                # a copy in this process's memory: the one received holds a descriptor of shared memory
                self._held[key] = mel.clone()
                self._bytes += mel.nbytes
            features.append(mel)
        while self._bytes > self.budget:
            self._bytes -= self._held.popitem(last=False)[1].nbytes
        return dataclasses.replace(request, audio_features=features)
