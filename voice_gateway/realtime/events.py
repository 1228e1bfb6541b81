"""The OpenAI Realtime protocol: every client and server event as a pydantic model, parsed and serialised here only.

One set of models serves two dialects. GA (`client.realtime.connect`) is the native shape.
Beta (`client.beta.realtime.connect`, which sends `OpenAI-Beta: realtime=v1`) differs in the
session object (flat `modalities`, `input_audio_format`, `turn_detection`, `voice`), in the
names of a few server events and in the type of assistant content parts (`text`/`audio` for
`output_text`/`output_audio`). Client events are accepted in either spelling on any connection;
`serialize` writes server events in the connection's dialect.

Opus is our extension: output format `{"type": "audio/opus"}` (GA) or `"opus"` (beta). Such a
session's audio leaves as binary WebSocket messages (framed by `audio/opus.py`) instead of
`response.output_audio.delta` events; everything else is unchanged.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from enum import StrEnum
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeInt,
    PlainSerializer,
    PlainValidator,
    SerializationInfo,
    TypeAdapter,
    ValidationError,
    field_serializer,
    field_validator,
)


class Dialect(StrEnum):
    GA = "ga"
    BETA = "beta"


def dialect_for(openai_beta_header: str | None) -> Dialect:
    """The beta client announces itself with `OpenAI-Beta: realtime=v1`; everyone else speaks GA."""
    tokens = {token.strip() for token in (openai_beta_header or "").split(",")}
    return Dialect.BETA if "realtime=v1" in tokens else Dialect.GA


class ProtocolError(Exception):
    """A client event we cannot act on: the session answers with an `error` event and lives on."""

    def __init__(self, code: str, message: str, event_id: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.event_id = event_id
        self.param = param


def _decode_base64(value: object) -> bytes:
    if isinstance(value, bytes):  # a server event built by the session from raw audio
        return value
    if not isinstance(value, str):
        raise ValueError("expected a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"invalid base64: {exc}") from None


# Raw bytes in Python, base64 text on the wire.
AudioBytes = Annotated[
    bytes,
    BeforeValidator(_decode_base64),
    PlainSerializer(lambda data: base64.b64encode(data).decode("ascii"), return_type=str),
]


def _dialect(info: SerializationInfo) -> Dialect:
    return Dialect((info.context or {}).get("dialect", Dialect.GA))


class _Model(BaseModel):
    # Clients send settings we do not implement (tools, tracing, noise_reduction, speed...);
    # ignoring them is what lets unmodified clients connect.
    model_config = ConfigDict(extra="ignore")


# ---------------------------------------------------------------- session config


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
_FORMATS_BY_GA_TYPE = {ga_type: fmt for fmt, ga_type in _GA_FORMAT_TYPES.items()}


def _ga_format(fmt: AudioFormat) -> dict[str, Any]:
    if fmt is AudioFormat.PCM16:
        return {"type": "audio/pcm", "rate": 24000}
    return {"type": _GA_FORMAT_TYPES[fmt]}


class TurnDetection(BaseModel, frozen=True):
    """Server VAD settings; a session without them takes a turn only on commit / response.create."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True


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


def session_payload(config: SessionConfig, dialect: Dialect) -> dict[str, Any]:
    """The `session` object of session.created / session.updated, in `dialect`'s shape."""
    voice = {"voice": config.voice} if config.voice is not None else {}
    vad = config.turn_detection
    turn_detection = {"type": "server_vad", **vad.model_dump()} if vad else None
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
            "turn_detection": turn_detection,
            "temperature": config.temperature,
            "max_response_output_tokens": config.max_output_tokens,
        }
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": config.id,
        **({"model": config.model} if config.model else {}),
        "output_modalities": [config.output_modality],
        "instructions": config.instructions,
        "max_output_tokens": config.max_output_tokens,
        "audio": {
            "input": {
                "format": _ga_format(config.input_audio_format),
                "turn_detection": turn_detection,
            },
            "output": {"format": _ga_format(config.output_audio_format), **voice},
        },
    }


# ---------------------------------------------------------------- config updates, both spellings


def _max_tokens(value: object) -> int | Literal["inf"]:
    if value == "inf":
        return "inf"
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise ValueError("expected a positive integer or 'inf'")


_Modalities = Annotated[list[Literal["text", "audio"]], Field(min_length=1)]
# One validator rather than a pydantic union, whose errors would name union members in `param`.
_MaxTokens = Annotated[int | Literal["inf"], PlainValidator(_max_tokens)]


class _GaInputFormat(_Model):
    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
    rate: Literal[24000] | None = None  # PCM is 24 kHz only


class _GaOutputFormat(_Model):
    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma", "audio/opus"]
    rate: Literal[24000] | None = None


class _TurnDetectionUpdate(_Model):
    type: Literal["server_vad"] = "server_vad"  # semantic_vad needs a turn model we do not have
    threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    prefix_padding_ms: NonNegativeInt | None = None
    silence_duration_ms: NonNegativeInt | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None


class _AudioInputUpdate(_Model):
    format: _GaInputFormat | None = None
    turn_detection: _TurnDetectionUpdate | None = None


class _AudioOutputUpdate(_Model):
    format: _GaOutputFormat | None = None
    voice: str | None = None


class _ResponseAudio(_Model):
    output: _AudioOutputUpdate | None = None


class _SessionAudio(_ResponseAudio):
    input: _AudioInputUpdate | None = None


class ResponseOverrides(_Model):
    """`response.create`'s settings for that response only; GA and beta field names side by side."""

    instructions: str | None = None
    output_modalities: _Modalities | None = None  # GA
    modalities: _Modalities | None = None  # beta
    max_output_tokens: _MaxTokens | None = None  # GA
    max_response_output_tokens: _MaxTokens | None = None  # beta
    temperature: float | None = None  # beta; GA dropped it, we still honour it
    voice: str | None = None  # beta
    output_audio_format: AudioFormat | None = None  # beta
    audio: _ResponseAudio | None = None  # GA


class SessionFields(ResponseOverrides):
    """`session.update`'s session object: the response settings plus input audio and turn taking."""

    type: Literal["realtime"] | None = None  # GA; transcription-only sessions are not served
    input_audio_format: Literal["pcm16", "g711_ulaw", "g711_alaw"] | None = None  # beta
    turn_detection: _TurnDetectionUpdate | None = None  # beta
    audio: _SessionAudio | None = None  # GA


def _first(ga_value: Any, beta_value: Any) -> Any:
    return ga_value if ga_value is not None else beta_value


def _from_ga(fmt: _GaInputFormat | _GaOutputFormat | None) -> AudioFormat | None:
    return None if fmt is None else _FORMATS_BY_GA_TYPE[fmt.type]


def _output_changes(fields: ResponseOverrides) -> dict[str, Any]:
    """The SessionConfig fields that `fields` sets (a null counts as absent); GA wins a tie."""
    output = fields.audio.output if fields.audio and fields.audio.output else None
    modalities = _first(fields.output_modalities, fields.modalities)
    changes = {
        "instructions": fields.instructions,
        "output_modality": None if modalities is None else ("audio" if "audio" in modalities else "text"),
        "max_output_tokens": _first(fields.max_output_tokens, fields.max_response_output_tokens),
        "temperature": fields.temperature,
        "voice": _first(output.voice if output else None, fields.voice),
        "output_audio_format": _first(_from_ga(output.format if output else None), fields.output_audio_format),
    }
    return {name: value for name, value in changes.items() if value is not None}


def _merge_vad(current: TurnDetection | None, update: _TurnDetectionUpdate | None) -> TurnDetection | None:
    if update is None:
        return None  # an explicit null: the client commits and asks for responses itself
    settings = update.model_dump(exclude_none=True, exclude={"type"})
    return (current or TurnDetection()).model_copy(update=settings)


def apply_session_update(current: SessionConfig, event: SessionUpdate) -> SessionConfig:
    """`current` with the fields the update names, in either dialect's shape; the rest stay."""
    session = event.session
    changes = _output_changes(session)
    audio_input = session.audio.input if session.audio and session.audio.input else None
    beta_input_format = AudioFormat(session.input_audio_format) if session.input_audio_format else None
    input_format = _first(_from_ga(audio_input.format if audio_input else None), beta_input_format)
    if input_format is not None:
        changes["input_audio_format"] = input_format
    # a present-but-null turn_detection means manual turns, so presence, not value, decides
    for holder in (audio_input, session):
        if holder is not None and "turn_detection" in holder.model_fields_set:
            changes["turn_detection"] = _merge_vad(current.turn_detection, holder.turn_detection)
            break
    return current.model_copy(update=changes)


def apply_response_overrides(config: SessionConfig, event: ResponseCreate) -> SessionConfig:
    """The settings one response runs with: the session's, overridden by `response.create`'s."""
    if event.response is None:
        return config
    return config.model_copy(update=_output_changes(event.response))


# ---------------------------------------------------------------- conversation items

_BETA_PART_TYPES = {"output_text": "text", "output_audio": "audio"}
_GA_PART_TYPES = {beta: ga for ga, beta in _BETA_PART_TYPES.items()}


class ContentPart(_Model):
    """One part of a message item; `type` holds the GA name, whichever dialect sent it."""

    type: Literal["input_text", "input_audio", "output_text", "output_audio"]
    text: str | None = None
    audio: AudioBytes | None = None
    transcript: str | None = None

    @field_validator("type", mode="before")
    @classmethod
    def _from_beta(cls, value: object) -> object:
        return _GA_PART_TYPES.get(value, value) if isinstance(value, str) else value

    @field_serializer("type")
    def _to_dialect(self, value: str, info: SerializationInfo) -> str:
        return _BETA_PART_TYPES.get(value, value) if _dialect(info) is Dialect.BETA else value


class MessageItem(_Model):
    """A conversation item; only messages exist here (no tools, so no function calls)."""

    id: str | None = None
    type: Literal["message"] = "message"
    object: Literal["realtime.item"] = "realtime.item"
    role: Literal["user", "assistant", "system"]
    status: Literal["completed", "incomplete", "in_progress"] | None = None
    content: list[ContentPart] = Field(default_factory=list)


# ---------------------------------------------------------------- client events


class _ClientEvent(_Model):
    event_id: str | None = None


class SessionUpdate(_ClientEvent):
    type: Literal["session.update"] = "session.update"
    session: SessionFields


class InputAudioAppend(_ClientEvent):
    type: Literal["input_audio_buffer.append"] = "input_audio_buffer.append"
    audio: AudioBytes  # in the session's input_audio_format


class InputAudioCommit(_ClientEvent):
    type: Literal["input_audio_buffer.commit"] = "input_audio_buffer.commit"


class InputAudioClear(_ClientEvent):
    type: Literal["input_audio_buffer.clear"] = "input_audio_buffer.clear"


class ConversationItemCreate(_ClientEvent):
    type: Literal["conversation.item.create"] = "conversation.item.create"
    item: MessageItem
    previous_item_id: str | None = None


class ConversationItemTruncate(_ClientEvent):
    type: Literal["conversation.item.truncate"] = "conversation.item.truncate"
    item_id: str
    content_index: NonNegativeInt
    audio_end_ms: NonNegativeInt  # how much of the item's audio the user heard


class ResponseCreate(_ClientEvent):
    type: Literal["response.create"] = "response.create"
    response: ResponseOverrides | None = None


class ResponseCancel(_ClientEvent):
    type: Literal["response.cancel"] = "response.cancel"
    response_id: str | None = None


class OutputAudioBufferClear(_ClientEvent):
    """WebRTC only: stop the reply audio that is playing now."""

    type: Literal["output_audio_buffer.clear"] = "output_audio_buffer.clear"


ClientEvent = Annotated[
    Union[
        SessionUpdate,
        InputAudioAppend,
        InputAudioCommit,
        InputAudioClear,
        ConversationItemCreate,
        ConversationItemTruncate,
        ResponseCreate,
        ResponseCancel,
        OutputAudioBufferClear,
    ],
    Field(discriminator="type"),
]
_CLIENT_EVENTS: TypeAdapter[ClientEvent] = TypeAdapter(ClientEvent)


def parse_client_event(raw: str | bytes) -> ClientEvent:
    """One WebSocket / data channel message as its event; anything else raises ProtocolError."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ProtocolError("invalid_json", f"the message is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError("invalid_json", "an event must be a JSON object")
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    try:
        return _CLIENT_EVENTS.validate_python(data)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
            event_type = data.get("type")
            message = f"unknown event type {event_type!r}" if event_type is not None else "the event has no 'type'"
            raise ProtocolError("unknown_event", message, event_id, "type") from None
        path = ".".join(str(part) for part in error["loc"][1:])  # loc[0] is the union tag
        raise ProtocolError("invalid_value", f"{path}: {error['msg']}", event_id, path) from None


# ---------------------------------------------------------------- server events


def _event_id() -> str:
    return f"event_{uuid.uuid4().hex[:20]}"


class _ServerEvent(_Model):
    event_id: str = Field(default_factory=_event_id)
    type: str

    def _payload(self, dialect: Dialect) -> dict[str, Any] | None:
        return self.model_dump(mode="json", exclude_none=True, context={"dialect": dialect})


class _SessionEvent(_ServerEvent):
    session: SessionConfig

    def _payload(self, dialect: Dialect) -> dict[str, Any]:
        return {"type": self.type, "event_id": self.event_id, "session": session_payload(self.session, dialect)}


class SessionCreated(_SessionEvent):
    type: Literal["session.created"] = "session.created"


class SessionUpdated(_SessionEvent):
    type: Literal["session.updated"] = "session.updated"


class SpeechStarted(_ServerEvent):
    type: Literal["input_audio_buffer.speech_started"] = "input_audio_buffer.speech_started"
    audio_start_ms: int  # on the session's input audio clock, prefix padding included
    item_id: str  # the user item the speech will become


class SpeechStopped(_ServerEvent):
    type: Literal["input_audio_buffer.speech_stopped"] = "input_audio_buffer.speech_stopped"
    audio_end_ms: int
    item_id: str


class InputAudioCommitted(_ServerEvent):
    type: Literal["input_audio_buffer.committed"] = "input_audio_buffer.committed"
    item_id: str
    previous_item_id: str | None = None


class InputAudioCleared(_ServerEvent):
    type: Literal["input_audio_buffer.cleared"] = "input_audio_buffer.cleared"


class _ItemEvent(_ServerEvent):
    item: MessageItem
    previous_item_id: str | None = None


class ConversationItemAdded(_ItemEvent):
    type: Literal["conversation.item.added"] = "conversation.item.added"


class ConversationItemDone(_ItemEvent):
    type: Literal["conversation.item.done"] = "conversation.item.done"

    def _payload(self, dialect: Dialect) -> dict[str, Any] | None:
        # beta has no such event: its conversation.item.created was the only announcement
        return None if dialect is Dialect.BETA else super()._payload(dialect)


class ConversationItemTruncated(_ServerEvent):
    type: Literal["conversation.item.truncated"] = "conversation.item.truncated"
    item_id: str
    content_index: int
    audio_end_ms: int


class ErrorDetail(_Model):
    type: str = "invalid_request_error"
    code: str | None = None
    message: str
    param: str | None = None
    event_id: str | None = None  # the client event that caused it


class InputTokenDetails(_Model):
    text_tokens: int = 0
    audio_tokens: int = 0
    cached_tokens: int = 0


class OutputTokenDetails(_Model):
    text_tokens: int = 0
    audio_tokens: int = 0


class Usage(_Model):
    total_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    input_token_details: InputTokenDetails = Field(default_factory=InputTokenDetails)
    output_token_details: OutputTokenDetails = Field(default_factory=OutputTokenDetails)


class StatusDetails(_Model):
    type: Literal["completed", "cancelled", "incomplete", "failed"]
    reason: Literal["turn_detected", "client_cancelled", "max_output_tokens", "content_filter"] | None = None
    error: ErrorDetail | None = None  # for `failed`


class RealtimeResponse(_Model):
    id: str
    object: Literal["realtime.response"] = "realtime.response"
    status: Literal["in_progress", "completed", "cancelled", "incomplete", "failed"] = "in_progress"
    status_details: StatusDetails | None = None
    output: list[MessageItem] = Field(default_factory=list)
    usage: Usage | None = None  # set on response.done


class ResponseCreated(_ServerEvent):
    type: Literal["response.created"] = "response.created"
    response: RealtimeResponse


class ResponseDone(_ServerEvent):
    type: Literal["response.done"] = "response.done"
    response: RealtimeResponse


class _OutputItemEvent(_ServerEvent):
    response_id: str
    output_index: int = 0
    item: MessageItem


class OutputItemAdded(_OutputItemEvent):
    type: Literal["response.output_item.added"] = "response.output_item.added"


class OutputItemDone(_OutputItemEvent):
    type: Literal["response.output_item.done"] = "response.output_item.done"


class _ContentEvent(_ServerEvent):
    """An event about one content part of one output item of one response."""

    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0


class OutputPart(_Model):
    """The part response.content_part.* announce; both SDKs type it `audio` or `text` here."""

    type: Literal["audio", "text"]
    text: str | None = None
    transcript: str | None = None


class ContentPartAdded(_ContentEvent):
    type: Literal["response.content_part.added"] = "response.content_part.added"
    part: OutputPart


class ContentPartDone(_ContentEvent):
    type: Literal["response.content_part.done"] = "response.content_part.done"
    part: OutputPart


class OutputAudioDelta(_ContentEvent):
    type: Literal["response.output_audio.delta"] = "response.output_audio.delta"
    delta: AudioBytes  # in the session's output_audio_format (never Opus: that goes out binary)


class OutputAudioDone(_ContentEvent):
    type: Literal["response.output_audio.done"] = "response.output_audio.done"


class OutputAudioTranscriptDelta(_ContentEvent):
    type: Literal["response.output_audio_transcript.delta"] = "response.output_audio_transcript.delta"
    delta: str


class OutputAudioTranscriptDone(_ContentEvent):
    type: Literal["response.output_audio_transcript.done"] = "response.output_audio_transcript.done"
    transcript: str


class OutputTextDelta(_ContentEvent):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    delta: str


class OutputTextDone(_ContentEvent):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    text: str


class OutputAudioBufferStarted(_ServerEvent):
    """WebRTC only: the server started playing a response's audio on the track."""

    type: Literal["output_audio_buffer.started"] = "output_audio_buffer.started"
    response_id: str


class OutputAudioBufferStopped(_ServerEvent):
    type: Literal["output_audio_buffer.stopped"] = "output_audio_buffer.stopped"
    response_id: str


class OutputAudioBufferCleared(_ServerEvent):
    type: Literal["output_audio_buffer.cleared"] = "output_audio_buffer.cleared"
    response_id: str


class ErrorEvent(_ServerEvent):
    type: Literal["error"] = "error"
    error: ErrorDetail

    @classmethod
    def from_protocol_error(cls, exc: ProtocolError) -> ErrorEvent:
        return cls(error=ErrorDetail(code=exc.code, message=exc.message, param=exc.param, event_id=exc.event_id))


ServerEvent = Union[
    SessionCreated,
    SessionUpdated,
    SpeechStarted,
    SpeechStopped,
    InputAudioCommitted,
    InputAudioCleared,
    ConversationItemAdded,
    ConversationItemDone,
    ConversationItemTruncated,
    ResponseCreated,
    ResponseDone,
    OutputItemAdded,
    OutputItemDone,
    ContentPartAdded,
    ContentPartDone,
    OutputAudioDelta,
    OutputAudioDone,
    OutputAudioTranscriptDelta,
    OutputAudioTranscriptDone,
    OutputTextDelta,
    OutputTextDone,
    OutputAudioBufferStarted,
    OutputAudioBufferStopped,
    OutputAudioBufferCleared,
    ErrorEvent,
]

_BETA_EVENT_TYPES = {
    "conversation.item.added": "conversation.item.created",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
}


def serialize(event: ServerEvent, dialect: Dialect) -> str | None:
    """The event as JSON text in `dialect`, or None where that dialect has no such event."""
    payload = event._payload(dialect)
    if payload is None:
        return None
    if dialect is Dialect.BETA:
        payload["type"] = _BETA_EVENT_TYPES.get(payload["type"], payload["type"])
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
