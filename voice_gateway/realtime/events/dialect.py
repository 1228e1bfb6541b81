"""The two spellings of the Realtime protocol: GA (native) and beta, and what beta calls things."""

from __future__ import annotations

from enum import StrEnum

from pydantic import SerializationInfo


class Dialect(StrEnum):
    GA = "ga"
    BETA = "beta"


def dialect_for(openai_beta_header: str | None) -> Dialect:
    """The beta client announces itself with `OpenAI-Beta: realtime=v1`; everyone else speaks GA."""
    tokens = {token.strip() for token in (openai_beta_header or "").split(",")}
    return Dialect.BETA if "realtime=v1" in tokens else Dialect.GA


def dialect_in(info: SerializationInfo) -> Dialect:
    return Dialect((info.context or {}).get("dialect", Dialect.GA))


# Assistant content part types: the beta SDK types them `text` / `audio`.
BETA_PART_TYPES = {"output_text": "text", "output_audio": "audio"}
GA_PART_TYPES = {beta: ga for ga, beta in BETA_PART_TYPES.items()}

# Server events that beta names differently; client events are accepted in either spelling.
BETA_EVENT_TYPES = {
    "conversation.item.added": "conversation.item.created",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
}
