"""A session's conversation: its items, and how they become the Thinker's prompt.

History is trimmed from the oldest item to fit the context budget (the
instructions always stay); an assistant item truncated after a barge-in keeps
only the part of its transcript the user heard.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

import numpy as np

from engine import INPUT_SAMPLE_RATE_HZ, AudioPart, Message, TextPart

# Prompt cost estimates, on the generous side: the engine checks the real count.
_TOKENS_PER_AUDIO_SECOND = 13  # Qwen3-Omni's audio encoder: 13 tokens per 100 mel frames (1 s)
_CHARS_PER_TOKEN = 3
_TOKENS_PER_TURN = 6  # <|im_start|>role\n ... <|im_end|>\n


def new_item_id() -> str:
    return f"item_{uuid.uuid4().hex[:20]}"


@dataclass(slots=True)
class Item:
    id: str
    role: Literal["user", "assistant", "system"]
    text: str = ""  # typed text, or the transcript of generated audio
    audio: np.ndarray | None = None  # user speech, float32 at 16 kHz
    audio_ms: int = 0  # how much audio the item holds (user) or was generated (assistant)
    status: Literal["in_progress", "completed", "incomplete"] = "completed"

    def estimated_tokens(self) -> int:
        audio_tokens = 0 if self.audio is None else int(self.audio_ms / 1000 * _TOKENS_PER_AUDIO_SECOND) + 3
        return _TOKENS_PER_TURN + len(self.text) // _CHARS_PER_TOKEN + 1 + audio_tokens


class Conversation:
    """Owns the items, in order."""

    def __init__(self) -> None:
        self.items: list[Item] = []

    def add(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Insert after `previous_item_id` (at the end when None); returns the id before it."""
        if previous_item_id is None:
            index = len(self.items)
        else:
            index = next((i + 1 for i, it in enumerate(self.items) if it.id == previous_item_id), -1)
            if index < 0:
                raise KeyError(previous_item_id)
        self.items.insert(index, item)
        return self.items[index - 1].id if index > 0 else None

    def get(self, item_id: str) -> Item | None:
        return next((it for it in self.items if it.id == item_id), None)

    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def truncate(self, item_id: str, audio_end_ms: int) -> Item:
        """Cut an assistant item's transcript to the share of its audio that was played."""
        item = self.get(item_id)
        if item is None:
            raise KeyError(item_id)
        if item.role != "assistant" or item.audio_ms <= 0:
            raise ValueError("only an assistant item with audio can be truncated")
        if audio_end_ms > item.audio_ms:
            raise ValueError(f"audio_end_ms {audio_end_ms} is past the item's {item.audio_ms} ms of audio")
        keep = int(len(item.text) * audio_end_ms / item.audio_ms)
        cut = item.text[:keep]
        # end on a word boundary: a half word was not heard as a word
        if keep < len(item.text) and " " in cut:
            cut = cut[: cut.rfind(" ")]
        item.text, item.audio_ms, item.status = cut, audio_end_ms, "incomplete"
        return item

    def to_messages(self, instructions: str, budget_tokens: int) -> tuple[Message, ...]:
        used = _TOKENS_PER_TURN + len(instructions) // _CHARS_PER_TOKEN if instructions else 0
        kept: list[Item] = []
        for item in reversed(self.items):
            cost = item.estimated_tokens()
            if used + cost > budget_tokens:
                break
            kept.append(item)
            used += cost
        messages = [Message("system", (TextPart(instructions),))] if instructions else []
        for item in reversed(kept):
            parts: list[TextPart | AudioPart] = []
            if item.audio is not None and item.audio.size:
                parts.append(AudioPart(item.audio))
            if item.text:
                parts.append(TextPart(item.text))
            if parts:
                messages.append(Message(item.role, tuple(parts)))
        return tuple(messages)


def audio_ms(samples_16k: np.ndarray) -> int:
    return int(samples_16k.size * 1000 / INPUT_SAMPLE_RATE_HZ)
