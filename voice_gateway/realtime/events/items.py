"""Conversation items as the protocol carries them: message items and their content parts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SerializationInfo, field_serializer, field_validator

from voice_gateway.realtime.events.dialect import BETA_PART_TYPES, GA_PART_TYPES, Dialect, dialect_in
from voice_gateway.realtime.events.wire import AudioBytes, EventModel
from voice_gateway.text import CleanText


class ContentPart(EventModel):
    """One part of a message item; `type` holds the GA name, whichever dialect sent it."""

    type: Literal["input_text", "input_audio", "output_text", "output_audio"]
    text: CleanText | None = None
    audio: AudioBytes | None = None
    transcript: CleanText | None = None

    @field_validator("type", mode="before")
    @classmethod
    def _from_beta(cls, value: object) -> object:
        return GA_PART_TYPES.get(value, value) if isinstance(value, str) else value

    @field_serializer("type")
    def _to_dialect(self, value: str, info: SerializationInfo) -> str:
        return BETA_PART_TYPES.get(value, value) if dialect_in(info) is Dialect.BETA else value


class MessageItem(EventModel):
    """A conversation item; only messages exist here (no tools, so no function calls)."""

    id: CleanText | None = None
    type: Literal["message"] = "message"
    object: Literal["realtime.item"] = "realtime.item"
    role: Literal["user", "assistant", "system"]
    status: Literal["completed", "incomplete", "in_progress"] | None = None
    content: list[ContentPart] = Field(default_factory=list)
