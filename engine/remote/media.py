"""Audio features and image pixels cross to the engine's process once, though a conversation's requests name them
every turn: sent every turn, they would cost copies and keep a file descriptor open in both processes each. A
server process sends one once (`SentMedia`, per connection) and names it by key after; the engine's process holds
what it was sent (`HeldMedia`), longer than any server process counts on, and should it have let one go anyway,
asks for that request whole (`Resend`).

They cross as numpy arrays, pickled inside the message. A torch tensor would cross as a descriptor of shared
memory, which the engine's reader fetches from the sender's process in a round of socket calls and handshakes;
each of them waits for the GIL in both processes, and the engine's is held by its stages' threads, so under load
a picture took ~0.1 s to cross and the requests behind it on the connection waited for it."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from engine.handoff import AdmittedRequest

SENT_MEDIA_BYTES = 512 << 20  # what a server process counts on its engine holding (80 turns of ~30 calls' audio)
HELD_MEDIA_BYTES = 4 << 30  # what an engine's process holds: eight server processes' counts

V = TypeVar("V")


class _Recent(Generic[V]):
    """Values by key, least recently used first, trimmed to a byte budget when asked (after a whole request)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._items: OrderedDict[int, tuple[V, int]] = OrderedDict()
        self._bytes = 0

    def get(self, key: int) -> V | None:
        if (item := self._items.get(key)) is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def add(self, key: int, value: V, nbytes: int) -> None:
        self._items[key] = (value, nbytes)
        self._bytes += nbytes

    def pop(self, key: int) -> None:
        if (item := self._items.pop(key, None)) is not None:
            self._bytes -= item[1]

    def trim(self) -> None:
        while self._bytes > self.budget:
            self._bytes -= self._items.popitem(last=False)[1][1]

    def clear(self) -> None:
        self._items.clear()
        self._bytes = 0


def _each(request: AdmittedRequest, media: Callable[[int, Any], Any]) -> AdmittedRequest:
    """The request with `media(key, value)` for every clip's features and image's pixels: a tensor, on the wire an
    array, or None where held already."""
    features = [media(key, mel) for key, mel in zip(request.audio_keys, request.audio_features, strict=True)]
    images = [dataclasses.replace(image, pixels=media(image.key, image.pixels))
              for image in request.images]
    return dataclasses.replace(request, audio_features=features, images=images)


class SentMedia:
    """The clips and images a server process sent on one connection lately, by key, within a byte budget."""

    def __init__(self, budget: int = SENT_MEDIA_BYTES) -> None:
        self._sent: _Recent[bool] = _Recent(budget)

    def strip(self, request: AdmittedRequest) -> AdmittedRequest:
        """The request as it crosses: what was sent lately left out (None), the rest as arrays of their own."""
        wire = _each(request, self._send)
        self._sent.trim()
        return wire

    def _send(self, key: int, tensor: torch.Tensor) -> np.ndarray | None:
        if self._sent.get(key):
            return None
        self._sent.add(key, True, tensor.nbytes)
        return tensor.numpy().copy()  # a copy: what is pickled later must not change meanwhile

    @staticmethod
    def leaves_out(wire: AdmittedRequest) -> bool:
        """Whether a stripped request names a clip or image it does not carry."""
        return any(mel is None for mel in wire.audio_features) or any(i.pixels is None for i in wire.images)

    def forget(self, request: AdmittedRequest) -> None:
        """The engine no longer holds the request's media: they cross again with the next that names them."""
        for key in [*request.audio_keys, *(image.key for image in request.images)]:
            self._sent.pop(key)

    def clear(self) -> None:
        self._sent.clear()


class HeldMedia:
    """The features and pixels an engine's process was sent, by key, least recently named first, in a budget."""

    def __init__(self, budget: int = HELD_MEDIA_BYTES) -> None:
        self._held: _Recent[torch.Tensor] = _Recent(budget)

    def fill(self, request: AdmittedRequest) -> AdmittedRequest | None:
        """The request with the media it names by key filled in; None when one is no longer held (send it whole)."""
        whole = _each(request, self._take)
        self._held.trim()
        return None if SentMedia.leaves_out(whole) else whole

    def _take(self, key: int, array: np.ndarray | None) -> torch.Tensor | None:
        """What the request reads: the tensor held, made now from what came if nothing was."""
        held = self._held.get(key)
        if held is None and array is not None:
            held = torch.from_numpy(array)  # unpickled, the array is this process's own
            self._held.add(key, held, array.nbytes)
        return held
