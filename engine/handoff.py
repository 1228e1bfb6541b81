"""What crosses between stages: frozen payloads, and the inbox each stage drains once per step.

Thinker -> Talker: the prompt's rows first (`ThinkerPrompt`), then one row per
decoded token (`ThinkerToken`), then `ThinkerDone`; so the Talker starts while
the Thinker still decodes. Talker -> Code2Wav: codec frames (`CodecFrames`) as
they are produced; Code2Wav cuts them into chunks itself. Stages never import
each other: they meet here.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Any, Literal

import torch


@dataclass(frozen=True, slots=True)
class ThinkerJob:
    """Orchestrator -> Thinker: a new request, already tokenised."""

    request_id: str
    token_ids: list[int]
    audio_features: list[torch.Tensor]
    want_audio: bool
    speaker: str
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None


@dataclass(frozen=True, slots=True)
class ThinkerPrompt:
    request_id: str
    token_ids: list[int]
    embeds: torch.Tensor  # [L, thinker_hidden]: layer-0 (input embedding) rows
    hidden: torch.Tensor  # [L, thinker_hidden]: rows of the talker's `accept_hidden_layer`
    speaker: str
    seed: int | None


@dataclass(frozen=True, slots=True)
class ThinkerToken:
    request_id: str
    token_id: int
    embed: torch.Tensor  # [thinker_hidden]


@dataclass(frozen=True, slots=True)
class ThinkerDone:
    request_id: str


@dataclass(frozen=True, slots=True)
class CodecFrames:
    request_id: str
    frames: torch.Tensor  # [num_quantizers, T] codes
    is_final: bool


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str


class Inbox:
    """A stage's input: thread-safe, drained at the top of every step."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def put(self, item: Any) -> None:
        self._queue.put(item)

    def drain(self, block_s: float | None) -> list[Any]:
        """All waiting items; waits up to `block_s` for the first when empty (None: no wait)."""
        items = []
        try:
            if block_s is not None:
                items.append(self._queue.get(timeout=block_s))
            while True:
                items.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        return items

    def qsize(self) -> int:
        return self._queue.qsize()


# What stages report to the orchestrator, besides the public TextDelta / AudioChunk events.


@dataclass(frozen=True, slots=True)
class ThinkerFinished:
    request_id: str
    finish_reason: Literal["stop", "length"]
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class AudioFinished:
    """Code2Wav sent a reply's last audio; `codec_frames` is how many frames the Talker made."""

    request_id: str
    codec_frames: int


@dataclass(frozen=True, slots=True)
class StageFailed:
    request_id: str
    reason: str
