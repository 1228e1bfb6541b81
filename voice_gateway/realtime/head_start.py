"""A reply started before its turn is sure to end: at a probable end of the user's turn the engine starts on the
reply the turn would get, and nothing of it reaches the client or the conversation until the turn ends. If it
ends as it probably would, the response adopts the engine's stream (its first audio may be made already); if the
speaker goes on, the engine request is aborted and no trace is left."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from engine import AudioPart, Message, RequestStream, TextPart


@dataclass(slots=True)
class HeadStart:
    """Owns the early engine request's stream until a response adopts it or it is dropped; `messages`: its prompt."""

    response_id: str
    stream: RequestStream
    messages: tuple[Message, ...]
    started_at: float = field(default_factory=time.perf_counter)

    def serves(self, messages: tuple[Message, ...]) -> bool:
        """Whether `messages`, the prompt of the response that is to run now, is the one this reply was started on."""
        return len(messages) == len(self.messages) and all(
            _same_message(a, b) for a, b in zip(messages, self.messages, strict=True))


def _same_message(a: Message, b: Message) -> bool:
    if a.role != b.role or a.tool_calls != b.tool_calls or len(a.content) != len(b.content):
        return False
    for x, y in zip(a.content, b.content, strict=True):
        if isinstance(x, AudioPart) and isinstance(y, AudioPart):
            if not np.array_equal(x.samples, y.samples):
                return False
        elif isinstance(x, TextPart) and isinstance(y, TextPart):
            if x != y:
                return False
        elif x is not y:  # pictures: only the very same
            return False
    return True
