"""A session's settings (`SessionConfig`, in neither dialect's shape), their wire payload, and the update fields.

The update models accept GA and beta field names side by side; `updates.py` turns them into a new config.
"""

from __future__ import annotations

import uuid
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PlainValidator, ValidationError

from voice_gateway.realtime.events.dialect import Dialect
from voice_gateway.realtime.events.items import ResponseInputItem
from voice_gateway.realtime.events.wire import EventModel
from voice_gateway.text import CleanText


class AudioFormat(StrEnum):
    PCM16 = "pcm16"  # 16-bit little-endian mono at 24 kHz
    G711_ULAW = "g711_ulaw"
    G711_ALAW = "g711_alaw"
    OPUS = "opus"  # output only: 20 ms packets in binary WebSocket messages


_GA_FORMAT_TYPES = {
    AudioFormat.PCM16: "audio/pcm",
    AudioFormat.G711_ULAW: "audio/pcmu",
    AudioFormat.G711_ALAW: "audio/pcma",
    AudioFormat.OPUS: "audio/opus",
}
FORMATS_BY_GA_TYPE = {ga_type: fmt for fmt, ga_type in _GA_FORMAT_TYPES.items()}


def _ga_format(fmt: AudioFormat) -> dict[str, Any]:
    if fmt is AudioFormat.PCM16:
        return {"type": "audio/pcm", "rate": 24000}
    return {"type": _GA_FORMAT_TYPES[fmt]}


Eagerness = Literal["low", "medium", "high", "auto"]


class TurnDetection(BaseModel, frozen=True):
    """Turn detection settings; a session without them takes a turn only on commit / response.create. `semantic_vad`
    ends a turn on Smart Turn's judgement, or where the model is absent on the server VAD with the silence its
    `eagerness` picks. The server VAD's own fields are kept for a switch back to `server_vad`."""

    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    eagerness: Eagerness = "auto"  # semantic_vad only
    idle_timeout_ms: int | None = None  # server_vad only, as OpenAI has it

    def end_of_turn_silence_ms(self) -> int:
        if self.type == "semantic_vad":
            return SEMANTIC_SILENCE_MS[self.eagerness]
        return self.silence_duration_ms

    def payload(self, dialect: Dialect) -> dict[str, Any]:
        """The wire object: each type with the fields OpenAI gives it (beta's server VAD had no idle timeout)."""
        if self.type == "semantic_vad":
            return {"type": "semantic_vad", "eagerness": self.eagerness, "create_response": self.create_response,
                    "interrupt_response": self.interrupt_response}
        fields = self.model_dump(exclude={"type", "eagerness", "idle_timeout_ms"})
        idle = {"idle_timeout_ms": self.idle_timeout_ms} if self.idle_timeout_ms is not None else {}
        if dialect is Dialect.BETA:
            idle = {}
        return {"type": "server_vad", **fields, **idle}


# The semantic_vad fallback (no Smart Turn model): how long a silence ends the turn at each eagerness. OpenAI's semantic model
# waits longer when eagerness is low; `auto` is its `medium`, which is the server VAD's default here.
SEMANTIC_SILENCE_MS: dict[str, int] = {"low": 1000, "medium": 500, "auto": 500, "high": 300}


class _FrozenSetting(BaseModel):
    """A setting that lives in the (frozen) session config and arrives in updates as it is stored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class FunctionTool(_FrozenSetting):
    """A function the model may call (the only kind of tool served); the same shape in both dialects."""

    type: Literal["function"] = "function"
    name: Annotated[CleanText, Field(min_length=1, max_length=64)]
    description: CleanText | None = None
    parameters: dict[str, Any] | None = None  # JSON Schema of the arguments; None: any object


class NamedToolChoice(_FrozenSetting):
    type: Literal["function"]
    name: Annotated[CleanText, Field(min_length=1)]


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


def _tool_choice(value: object) -> ToolChoice:
    """One validator rather than a union, whose errors would name union members in `param`."""
    if value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        try:
            return NamedToolChoice.model_validate(value)
        except ValidationError:
            pass
    raise ValueError("expected 'auto', 'none', 'required' or {\"type\": \"function\", \"name\": ...} "
                     "(function tools are the only kind served)")


class TokenLimits(_FrozenSetting):
    # what the conversation may take after the instructions and tools; the context's own room caps it
    post_instructions: Annotated[int, Field(strict=True, ge=1)] | None = None


class RetentionRatio(_FrozenSetting):
    """Once the conversation outgrows its room, the oldest items leave until this share of it is used."""

    type: Literal["retention_ratio"]
    retention_ratio: Annotated[float, Field(ge=0.0, le=1.0)]
    token_limits: TokenLimits | None = None


Truncation = Literal["auto", "disabled"] | RetentionRatio


def _truncation(value: object) -> Truncation:
    if value in ("auto", "disabled"):
        return value
    if isinstance(value, dict) and value.get("type") == "retention_ratio":
        return RetentionRatio.model_validate(value)
    raise ValueError("expected 'auto', 'disabled' or {\"type\": \"retention_ratio\", \"retention_ratio\": 0.0-1.0}")


class Transcription(_FrozenSetting):
    """Input audio transcription settings. The Thinker transcribes whatever `model` names (echoed as sent)."""

    model: CleanText | None = None
    language: Annotated[CleanText, Field(max_length=32)] | None = None
    prompt: CleanText | None = None


class SessionConfig(BaseModel, frozen=True):
    """What a session is set to, in neither dialect's shape: the session logic reads only this."""

    id: str = Field(default_factory=lambda: f"sess_{uuid.uuid4().hex[:20]}")
    model: str | None = None
    output_modality: Literal["audio", "text"] = "audio"  # an audio reply carries its transcript too
    instructions: str = ""
    voice: str | None = None  # None: the engine's default speaker
    input_audio_format: AudioFormat = AudioFormat.PCM16
    output_audio_format: AudioFormat = AudioFormat.PCM16
    turn_detection: TurnDetection | None = Field(default_factory=TurnDetection)
    max_output_tokens: int | Literal["inf"] = "inf"
    temperature: float = 0.8
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = "auto"
    transcription: Transcription | None = None  # None: committed audio is not transcribed
    truncation: Truncation = "auto"


def session_payload(config: SessionConfig, dialect: Dialect) -> dict[str, Any]:
    voice = {"voice": config.voice} if config.voice is not None else {}
    tools = {
        "tools": [t.model_dump(exclude_none=True) for t in config.tools],
        "tool_choice": config.tool_choice if isinstance(config.tool_choice, str) else config.tool_choice.model_dump(),
    }
    transcription = config.transcription.model_dump(exclude_none=True) if config.transcription else None
    vad = config.turn_detection
    turn_detection = vad.payload(dialect) if vad else None
    if dialect is Dialect.BETA:
        # no `model`: the beta SDK types only admit OpenAI's model names there
        return {
            "id": config.id,
            "object": "realtime.session",
            "modalities": ["text", "audio"] if config.output_modality == "audio" else ["text"],
            "instructions": config.instructions,
            **voice,
            "input_audio_format": config.input_audio_format.value,
            "output_audio_format": config.output_audio_format.value,
            "input_audio_transcription": transcription,
            "turn_detection": turn_detection,
            "temperature": config.temperature,
            "max_response_output_tokens": config.max_output_tokens,
            **tools,
        }
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": config.id,
        **({"model": config.model} if config.model else {}),
        "output_modalities": [config.output_modality],
        "instructions": config.instructions,
        "max_output_tokens": config.max_output_tokens,
        **tools,
        "truncation": config.truncation if isinstance(config.truncation, str)
        else config.truncation.model_dump(exclude_none=True),
        "audio": {
            "input": {
                "format": _ga_format(config.input_audio_format),
                "transcription": transcription,
                "turn_detection": turn_detection,
            },
            "output": {"format": _ga_format(config.output_audio_format), **voice},
        },
    }


# ---------------------------------------------------------------- update fields, both spellings


def _max_tokens(value: object) -> int | Literal["inf"]:
    if value == "inf":
        return "inf"
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise ValueError("expected a positive integer or 'inf'")


_Modalities = Annotated[list[Literal["text", "audio"]], Field(min_length=1)]
# One validator rather than a pydantic union, whose errors would name union members in `param`.
_MaxTokens = Annotated[int | Literal["inf"], PlainValidator(_max_tokens)]
# OpenAI's realtime range is 0.6-1.2; we sample any temperature chat accepts, so [0, 2] as there.
_Temperature = Annotated[float, Field(strict=True, ge=0.0, le=2.0)]
_Voice = Annotated[CleanText, Field(min_length=1)]
# OpenAI's limits: 16 pairs, keys up to 64 characters, values up to 512; echoed in response.created/done
_Metadata = Annotated[
    dict[Annotated[CleanText, Field(max_length=64)], Annotated[CleanText, Field(max_length=512)]],
    Field(max_length=16),
]


class GaInputFormat(EventModel):
    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
    rate: Literal[24000] | None = None  # PCM is 24 kHz only


class GaOutputFormat(EventModel):
    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma", "audio/opus"]
    rate: Literal[24000] | None = None


class TurnDetectionUpdate(EventModel):
    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    prefix_padding_ms: NonNegativeInt | None = None
    silence_duration_ms: NonNegativeInt | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None
    eagerness: Eagerness | None = None
    # OpenAI's range; a null turns it off
    idle_timeout_ms: Annotated[int, Field(strict=True, ge=5000, le=30000)] | None = None


class _AudioInputUpdate(EventModel):
    format: GaInputFormat | None = None
    transcription: Transcription | None = None  # a null turns it off
    turn_detection: TurnDetectionUpdate | None = None


class _AudioOutputUpdate(EventModel):
    format: GaOutputFormat | None = None
    voice: _Voice | None = None


class _ResponseAudio(EventModel):
    output: _AudioOutputUpdate | None = None


class _SessionAudio(_ResponseAudio):
    input: _AudioInputUpdate | None = None


class OutputSettings(EventModel):
    """The settings of a response that `session.update` and `response.create` share; GA and beta names side by side."""

    instructions: CleanText | None = None
    output_modalities: _Modalities | None = None  # GA
    modalities: _Modalities | None = None  # beta
    max_output_tokens: _MaxTokens | None = None  # GA
    max_response_output_tokens: _MaxTokens | None = None  # beta
    temperature: _Temperature | None = None  # beta; GA dropped it, we still honour it
    voice: _Voice | None = None  # beta
    output_audio_format: AudioFormat | None = None  # beta
    audio: _ResponseAudio | None = None  # GA
    tools: list[FunctionTool] | None = None
    tool_choice: Annotated[ToolChoice, PlainValidator(_tool_choice)] | None = None


class ResponseOverrides(OutputSettings):
    """`response.create`'s settings for one response, its metadata, its conversation and the items it brings."""

    metadata: _Metadata | None = None  # the response carries it back
    conversation: Literal["auto", "none"] | None = None  # "none": out of band (None: "auto")
    input: list[ResponseInputItem] | None = None  # None: the conversation's history; []: the instructions alone


class SessionFields(OutputSettings):
    """`session.update`'s session object: the response settings plus input audio and turn taking."""

    type: Literal["realtime"] | None = None  # GA; transcription-only sessions are not served
    input_audio_format: Literal["pcm16", "g711_ulaw", "g711_alaw"] | None = None  # beta
    input_audio_transcription: Transcription | None = None  # beta; a null turns it off
    turn_detection: TurnDetectionUpdate | None = None  # beta
    audio: _SessionAudio | None = None  # GA
    truncation: Annotated[Truncation, PlainValidator(_truncation)] | None = None  # GA


def format_from_ga(fmt: GaInputFormat | GaOutputFormat | None) -> AudioFormat | None:
    return None if fmt is None else FORMATS_BY_GA_TYPE[fmt.type]


def merge_turn_detection(current: TurnDetection | None, update: TurnDetectionUpdate | None) -> TurnDetection | None:
    if update is None:
        return None  # an explicit null: the client commits and asks for responses itself
    settings = update.model_dump(exclude_none=True)
    settings["type"] = update.type  # always: OpenAI's type is required, our default is server_vad
    if "idle_timeout_ms" in update.model_fields_set:
        settings["idle_timeout_ms"] = update.idle_timeout_ms  # an explicit null turns it off
    return (current or TurnDetection()).model_copy(update=settings)
