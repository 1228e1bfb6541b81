"""Audio features and image pixels cross to the engine's process once, though a conversation's requests name
them every turn.

A realtime conversation's prompt holds every earlier turn's audio and pictures, so each turn's request
carried all of them: by turn 80 of a call, 80 clips of 4 s, 16 MB of features, ~16 ms between two processes
on a 2-core CPU; a session that sends a camera frame with every turn, 16 pictures of 9.6 MB of pixels each
once it holds its most. The engine reads only those past its cached prefix. Passed as tensors, each also kept
a file descriptor open in both processes for as long as either held it (torch shares a tensor's memory
through one), so a server process that held thousands of clips' features held thousands of descriptors.

Now a server process sends a clip's features or an image's pixels once (`SentMedia`, per connection) and
names it by its key after; the engine's process holds what it was sent (`HeldMedia`, one for all its
connections), in its own memory, longer than any server process counts on. Should it have let a named one
go anyway, it asks for that request whole (`Resend`), and the server process sends it with all of them.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import torch

from engine.handoff import AdmittedRequest

SENT_MEDIA_BYTES = 512 << 20  # what a server process counts on its engine holding (80 turns of ~30 calls' audio)
HELD_MEDIA_BYTES = 4 << 30  # what an engine's process holds: eight server processes' counts


class SentMedia:
    """The clips and images a server process sent on one connection lately, by key, oldest first, within a
    byte budget."""

    def __init__(self, budget: int = SENT_MEDIA_BYTES) -> None:
        self.budget = budget
        self._sent: OrderedDict[int, int] = OrderedDict()  # key -> bytes
        self._bytes = 0

    def strip(self, request: AdmittedRequest) -> AdmittedRequest:
        """The request as it crosses: what was sent lately left out (None), the rest copied, so that sending
        never moves the server process's own tensors into shared memory."""
        features = [self._send(key, mel) for key, mel in zip(request.audio_keys, request.audio_features, strict=True)]
        pixels = [self._send(image.key, image.pixel_values) for image in request.images]
        # the wire form: None where the engine holds it already (HeldMedia.fill puts it back)
        images = [dataclasses.replace(image, pixel_values=p)  # type: ignore[arg-type]
                  for image, p in zip(request.images, pixels, strict=True)]
        while self._bytes > self.budget:
            self._bytes -= self._sent.popitem(last=False)[1]
        return dataclasses.replace(request, audio_features=features, images=images)  # type: ignore[arg-type]

    def _send(self, key: int, tensor: torch.Tensor) -> torch.Tensor | None:
        if key in self._sent:
            self._sent.move_to_end(key)
            return None
        self._sent[key] = tensor.nbytes
        self._bytes += tensor.nbytes
        return tensor.clone()

    @staticmethod
    def leaves_out(wire: AdmittedRequest) -> bool:
        """Whether a stripped request names a clip or image it does not carry."""
        return any(mel is None for mel in wire.audio_features) or any(i.pixel_values is None for i in wire.images)

    def forget(self, request: AdmittedRequest) -> None:
        """The engine no longer holds the request's media: they cross again with the next that names them."""
        for key in [*request.audio_keys, *(image.key for image in request.images)]:
            self._bytes -= self._sent.pop(key, 0)

    def clear(self) -> None:
        """A new connection: its engine holds nothing yet."""
        self._sent.clear()
        self._bytes = 0


class HeldMedia:
    """The features and pixels an engine's process was sent, by key, least recently named first, within a
    byte budget."""

    def __init__(self, budget: int = HELD_MEDIA_BYTES) -> None:
        self.budget = budget
        self._held: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._bytes = 0

    def fill(self, request: AdmittedRequest) -> AdmittedRequest | None:
        """The request with every clip's features and image's pixels, those it names by key from the ones
        held; None when it names one no longer held (then it must come whole)."""
        taken = [self._take(key, mel) for key, mel in zip(request.audio_keys, request.audio_features, strict=True)]
        taken_pixels = [self._take(image.key, image.pixel_values) for image in request.images]
        while self._bytes > self.budget:
            self._bytes -= self._held.popitem(last=False)[1].nbytes
        features = [mel for mel in taken if mel is not None]
        pixels = [p for p in taken_pixels if p is not None]
        if len(features) < len(taken) or len(pixels) < len(taken_pixels):
            return None
        images = [dataclasses.replace(image, pixel_values=p) for image, p in zip(request.images, pixels, strict=True)]
        return dataclasses.replace(request, audio_features=features, images=images)

    def _take(self, key: int, tensor: torch.Tensor | None) -> torch.Tensor | None:
        if tensor is None:
            if (held := self._held.get(key)) is not None:
                self._held.move_to_end(key)
            return held
        if key not in self._held:
            # a copy in this process's memory: the one received holds a descriptor of shared memory
            self._held[key] = tensor.clone()
            self._bytes += tensor.nbytes
        return tensor
