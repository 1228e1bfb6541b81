"""Server events: one pydantic model each, serialised in the connection's dialect here only."""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import Field, SerializationInfo, SerializerFunctionWrapHandler, model_serializer

from voice_gateway.realtime.events.client import ProtocolError
from voice_gateway.realtime.events.dialect import BETA_EVENT_TYPES, Dialect, dialect_in
from voice_gateway.realtime.events.items import ConversationItem
from voice_gateway.realtime.events.session import SessionConfig, session_payload
from voice_gateway.realtime.events.wire import AudioBytes, EventModel


def _event_id() -> str:
    return f"event_{uuid.uuid4().hex[:20]}"


class _ServerEvent(EventModel):
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


class DtmfEventReceived(_ServerEvent):
    """A phone caller pressed a key (OpenAI's name for the event; `event` is the digit, `received_at` Unix seconds)."""

    type: Literal["input_audio_buffer.dtmf_event_received"] = "input_audio_buffer.dtmf_event_received"
    event: str
    received_at: int


class _ItemEvent(_ServerEvent):
    item: ConversationItem
    previous_item_id: str | None = None


class ConversationItemAdded(_ItemEvent):
    type: Literal["conversation.item.added"] = "conversation.item.added"


class ConversationItemDone(_ItemEvent):
    type: Literal["conversation.item.done"] = "conversation.item.done"

    def _payload(self, dialect: Dialect) -> dict[str, Any] | None:
        # beta has no such event: its conversation.item.created was the only announcement
        return None if dialect is Dialect.BETA else super()._payload(dialect)


class ConversationItemDeleted(_ServerEvent):
    type: Literal["conversation.item.deleted"] = "conversation.item.deleted"
    item_id: str


class ConversationItemRetrieved(_ServerEvent):
    type: Literal["conversation.item.retrieved"] = "conversation.item.retrieved"
    item: ConversationItem


class InputAudioTimeoutTriggered(_ServerEvent):
    """`idle_timeout_ms` passed with no speech after a reply played: a response is asked for."""

    type: Literal["input_audio_buffer.timeout_triggered"] = "input_audio_buffer.timeout_triggered"
    audio_start_ms: int
    audio_end_ms: int
    item_id: str

    def _payload(self, dialect: Dialect) -> dict[str, Any] | None:
        return None if dialect is Dialect.BETA else super()._payload(dialect)  # a GA event only


class ConversationItemTruncated(_ServerEvent):
    type: Literal["conversation.item.truncated"] = "conversation.item.truncated"
    item_id: str
    content_index: int
    audio_end_ms: int


class ErrorDetail(EventModel):
    type: str = "invalid_request_error"
    code: str | None = None
    message: str
    param: str | None = None
    event_id: str | None = None  # the client event that caused it


class InputTokenDetails(EventModel):
    text_tokens: int = 0
    audio_tokens: int = 0
    image_tokens: int = 0  # GA's: beta has no images
    cached_tokens: int = 0

    @model_serializer(mode="wrap")
    def _to_dialect(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        payload: dict[str, Any] = handler(self)
        if dialect_in(info) is Dialect.BETA:
            del payload["image_tokens"]
        return payload


class OutputTokenDetails(EventModel):
    text_tokens: int = 0
    audio_tokens: int = 0


class Usage(EventModel):
    total_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    input_token_details: InputTokenDetails = Field(default_factory=InputTokenDetails)
    output_token_details: OutputTokenDetails = Field(default_factory=OutputTokenDetails)


class StatusDetails(EventModel):
    type: Literal["completed", "cancelled", "incomplete", "failed"]
    reason: Literal["turn_detected", "client_cancelled", "max_output_tokens", "content_filter"] | None = None
    error: ErrorDetail | None = None  # for `failed`


class RealtimeResponse(EventModel):
    id: str
    object: Literal["realtime.response"] = "realtime.response"
    status: Literal["in_progress", "completed", "cancelled", "incomplete", "failed"] = "in_progress"
    status_details: StatusDetails | None = None
    output: list[ConversationItem] = Field(default_factory=list)
    usage: Usage | None = None  # set on response.done
    metadata: dict[str, str] | None = None  # response.create's, echoed (LiveKit matches replies by it)


class ResponseCreated(_ServerEvent):
    type: Literal["response.created"] = "response.created"
    response: RealtimeResponse


class ResponseDone(_ServerEvent):
    type: Literal["response.done"] = "response.done"
    response: RealtimeResponse


class _OutputItemEvent(_ServerEvent):
    response_id: str
    output_index: int = 0
    item: ConversationItem


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


class OutputPart(EventModel):
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


class _CallEvent(_ServerEvent):
    """An event about one function call item of one response."""

    response_id: str
    item_id: str
    output_index: int
    call_id: str


class FunctionCallArgumentsDelta(_CallEvent):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    delta: str  # a piece of the arguments' JSON text, as the model writes it


class FunctionCallArgumentsDone(_CallEvent):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    name: str
    arguments: str

    def _payload(self, dialect: Dialect) -> dict[str, Any] | None:
        payload = super()._payload(dialect)
        if payload is not None and dialect is Dialect.BETA:
            del payload["name"]  # GA added it
        return payload


class TranscriptionTokenDetails(EventModel):
    text_tokens: int = 0
    audio_tokens: int = 0


class TranscriptionUsage(EventModel):
    """A transcription's usage, billed by tokens (OpenAI's other kind, by duration, is not used here)."""

    type: Literal["tokens"] = "tokens"
    total_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    input_token_details: TranscriptionTokenDetails = Field(default_factory=TranscriptionTokenDetails)


class _TranscriptionEvent(_ServerEvent):
    item_id: str  # the user item whose audio is transcribed
    content_index: int = 0  # its input_audio part


class InputTranscriptionDelta(_TranscriptionEvent):
    type: Literal["conversation.item.input_audio_transcription.delta"] = (
        "conversation.item.input_audio_transcription.delta")
    delta: str


class InputTranscriptionCompleted(_TranscriptionEvent):
    type: Literal["conversation.item.input_audio_transcription.completed"] = (
        "conversation.item.input_audio_transcription.completed")
    transcript: str
    usage: TranscriptionUsage


class InputTranscriptionFailed(_TranscriptionEvent):
    type: Literal["conversation.item.input_audio_transcription.failed"] = (
        "conversation.item.input_audio_transcription.failed")
    error: ErrorDetail


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


class FirstPacketPartsMs(EventModel):
    """Where the engine's first packet went, in ms (engine/api.py `FirstPacketParts`): rounded where one part ends
    and the next begins, so that they add up to `engine_first_packet_ms` (give or take a millisecond)."""

    queued_ms: int  # submit -> the Thinker takes the request from its queue
    thinker_ms: int  # -> its first token (the prompt's prefill, or what a kept prefix left of it)
    talker_prefill_ms: int  # -> the Talker holds the prompt's rows (the Thinker's handoff) and the reply's header
    talker_frames_ms: int  # -> Code2Wav begins its first chunk
    code2wav_ms: int  # -> the first packet


class ResponseTiming(_ServerEvent):
    """Our extension (`?timing=1` on the session's URL): where a spoken reply's wait went, once it is done. Each
    `_ms` but the engine's own is ms on the server's clock from the end of the user's speech (the end of its last
    voiced frame, as `speech_stopped.audio_end_ms` says) for a response to a turn that turn detection ended, and
    from the response's asking (its `response.create`, or the idle timeout) for any other: `turn_ms` the turn
    decided (`speech_stopped` sent; null for any other), `heard_ms` the turn's words heard and `ears_ms` the
    ears' time on them (null where the engine hears audio itself, or no turn was detected), `reply_started_ms`
    the engine's request (before `turn_ms` when it started on a probable end), `first_token_ms` its first text
    token, `first_audio_ms` its first audio sent. `engine_first_packet_ms` counts on the engine's own clock from
    its request to its first packet, and `first_packet_parts_ms` splits it by stage (null where the engine does
    not report them)."""

    type: Literal["response.timing"] = "response.timing"
    response_id: str
    turn_ms: int | None = None
    heard_ms: int | None = None
    ears_ms: int | None = None
    reply_started_ms: int
    first_token_ms: int | None = None
    first_audio_ms: int
    engine_first_packet_ms: int | None = None
    first_packet_parts_ms: FirstPacketPartsMs | None = None

    def _payload(self, dialect: Dialect) -> dict[str, Any] | None:
        return self.model_dump(mode="json", context={"dialect": dialect})


ServerEvent = (
    SessionCreated
    | DtmfEventReceived
    | SessionUpdated
    | SpeechStarted
    | SpeechStopped
    | InputAudioCommitted
    | InputAudioCleared
    | ConversationItemAdded
    | ConversationItemDone
    | ConversationItemDeleted
    | ConversationItemRetrieved
    | InputAudioTimeoutTriggered
    | ConversationItemTruncated
    | ResponseCreated
    | ResponseDone
    | OutputItemAdded
    | OutputItemDone
    | ContentPartAdded
    | ContentPartDone
    | OutputAudioDelta
    | OutputAudioDone
    | OutputAudioTranscriptDelta
    | OutputAudioTranscriptDone
    | OutputTextDelta
    | OutputTextDone
    | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
    | InputTranscriptionDelta
    | InputTranscriptionCompleted
    | InputTranscriptionFailed
    | OutputAudioBufferStarted
    | OutputAudioBufferStopped
    | ResponseTiming
    | OutputAudioBufferCleared
    | ErrorEvent
)


def serialize(event: ServerEvent, dialect: Dialect) -> str | None:
    """The event as JSON text in `dialect`, or None where that dialect has no such event."""
    payload = event._payload(dialect)
    if payload is None:
        return None
    if dialect is Dialect.BETA:
        payload["type"] = BETA_EVENT_TYPES.get(payload["type"], payload["type"])
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))

