"""The chat-completions request we accept, as pydantic models (parsed here only)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    # OpenAI clients send fields we do not use (user, metadata, store, ...): accept and ignore them.
    model_config = ConfigDict(extra="allow")


class TextContent(_Open):
    type: Literal["text"]
    text: str


class InputAudio(_Open):
    data: str
    format: Literal["wav", "mp3", "flac", "ogg", "pcm16"] = "wav"


class InputAudioContent(_Open):
    type: Literal["input_audio"]
    input_audio: InputAudio


ContentPart = Annotated[TextContent | InputAudioContent, Field(discriminator="type")]


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None


class AudioParams(_Open):
    voice: str | None = None
    format: Literal["wav", "pcm16", "flac"] = "wav"


class StreamOptions(_Open):
    include_usage: bool = False


class ChatCompletionRequest(_Open):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioParams | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = None
    n: int | None = Field(default=None, ge=1, le=1)
