"""One realtime response: runs the engine request and streams its transcript and audio as events.

Audio goes to the response's `AudioSink` (`audio_sinks.py`), which the session
chose for its output format. A cancelled response (barge-in, `response.cancel`, a slow reader) stops at once:
the engine request is aborted and its queued audio dropped by the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from engine import (
    OVERLOADED,
    UNAVAILABLE,
    AudioChunk,
    Engine,
    EngineError,
    EngineRequest,
    Failed,
    Finished,
    Message,
    SamplingParams,
    TextDelta,
    Timings,
)
from voice_gateway.realtime.audio_sinks import REPLY_RATE_HZ, AudioSink
from voice_gateway.realtime.conversation import Item
from voice_gateway.realtime.events import (
    ContentPart,
    ContentPartAdded,
    ContentPartDone,
    ConversationItemAdded,
    ConversationItemDone,
    ErrorDetail,
    InputTokenDetails,
    MessageItem,
    OutputAudioDone,
    OutputAudioTranscriptDelta,
    OutputAudioTranscriptDone,
    OutputItemAdded,
    OutputItemDone,
    OutputPart,
    OutputTextDelta,
    OutputTextDone,
    OutputTokenDetails,
    RealtimeResponse,
    ResponseCreated,
    ResponseDone,
    ServerEvent,
    SessionConfig,
    StatusDetails,
    Usage,
)
from voice_gateway.realtime.outbox import OutboxFull
from voice_gateway.realtime.sender import EventSender

log = logging.getLogger(__name__)

Status = Literal["completed", "cancelled", "failed"]
CancelReason = Literal["turn_detected", "client_cancelled"]


class SlowConsumer(Exception):
    pass


@dataclass(slots=True)
class ResponseOutcome:
    status: Status = "completed"
    reason: CancelReason | None = None
    error: ErrorDetail | None = None


@dataclass(slots=True)
class Response:
    """A response's state; the session owns it and may cancel it."""

    id: str
    item: Item
    config: SessionConfig
    sink: AudioSink  # where its audio goes: the session's sink for config.output_audio_format
    speech_stopped_at: float | None = None  # perf_counter of the VAD stop that triggered it
    speaker: str | None = None  # config.voice as the engine names it (None: its default)
    metadata: dict[str, str] | None = None  # response.create's, echoed in response.created and response.done
    first_audio_at: float | None = None
    outcome: ResponseOutcome = field(default_factory=ResponseOutcome)
    task: asyncio.Task | None = None

    @staticmethod
    def new(item: Item, config: SessionConfig, sink: AudioSink, speech_stopped_at: float | None,
            speaker: str | None = None, metadata: dict[str, str] | None = None) -> Response:
        return Response(f"resp_{uuid.uuid4().hex[:20]}", item, config, sink, speech_stopped_at, speaker, metadata)


class ResponseRunner:
    """Streams one response: events through `sender`, audio into the response's sink."""

    def __init__(self, engine: Engine, response: Response, sender: EventSender) -> None:
        self.engine = engine
        self.r = response
        self.sender = sender
        self.audio_mode = response.config.output_modality == "audio"
        self.transcript = ""
        self.audio_samples = 0

    def _content(self, event_cls: Callable[..., ServerEvent], **fields: Any) -> ServerEvent:
        return event_cls(response_id=self.r.id, item_id=self.r.item.id, **fields)

    async def run(self, messages: tuple[Message, ...], previous_item_id: str | None) -> None:
        r, item = self.r, self.r.item
        self.sender.event(ResponseCreated(response=RealtimeResponse(id=r.id, metadata=r.metadata)))
        announced = MessageItem(id=item.id, role="assistant", status="in_progress")
        self.sender.event(OutputItemAdded(response_id=r.id, item=announced))
        self.sender.event(ConversationItemAdded(item=announced, previous_item_id=previous_item_id))
        part = OutputPart(type="audio", transcript="") if self.audio_mode else OutputPart(type="text", text="")
        self.sender.event(self._content(ContentPartAdded, part=part))
        usage = Usage()
        try:
            usage = await self._stream(messages)
        except asyncio.CancelledError:
            r.outcome.status = "cancelled"
        except SlowConsumer:
            r.outcome = ResponseOutcome("failed", None, ErrorDetail(type="server_error", code="slow_consumer",
                                                                    message="the client did not read fast enough"))
        except EngineError as e:
            kind = "server_error" if e.code in (OVERLOADED, UNAVAILABLE) else "invalid_request_error"
            r.outcome = ResponseOutcome("failed", None, ErrorDetail(type=kind, code=e.code or "invalid_request",
                                                                    message=str(e)))
        self._finish(usage)

    async def _stream(self, messages: tuple[Message, ...]) -> Usage:
        cfg = self.r.config
        max_tokens = None if cfg.max_output_tokens == "inf" else cfg.max_output_tokens
        request = EngineRequest(
            request_id=self.r.id,
            messages=messages,
            want_audio=self.audio_mode,
            speaker=self.r.speaker,
            sampling=SamplingParams(max_tokens=max_tokens, temperature=cfg.temperature),
        )
        stream = await self.engine.submit(request)
        sink, usage = self.r.sink, Usage()
        if self.audio_mode:
            sink.begin(self.r.id, self.r.item.id)
        try:
            async for event in stream:
                if isinstance(event, TextDelta):
                    self.transcript += event.text
                    delta_cls = OutputAudioTranscriptDelta if self.audio_mode else OutputTextDelta
                    self.sender.event(self._content(delta_cls, delta=event.text))
                elif isinstance(event, AudioChunk):
                    self._audio(event.samples)
                elif isinstance(event, Finished):
                    usage = _usage(event.timings)
                    break
                elif isinstance(event, Failed):
                    self.r.outcome = ResponseOutcome("failed", None, ErrorDetail(
                        type="server_error", code=event.code or "engine_failed", message=event.reason))
            if self.audio_mode:
                with _slow_consumer_if_full():
                    sink.finish()  # a failed reply's audio plays out too
            return usage
        finally:
            await stream.aclose()

    def _audio(self, samples: np.ndarray) -> None:
        if self.r.first_audio_at is None:
            self.r.first_audio_at = time.perf_counter()
        self.audio_samples += samples.size
        with _slow_consumer_if_full():
            self.r.sink.write(samples)

    def _finish(self, usage: Usage) -> None:
        r, item, outcome = self.r, self.r.item, self.r.outcome
        item.text = self.transcript
        item.audio_ms = self.audio_samples * 1000 // REPLY_RATE_HZ
        item.status = "completed" if outcome.status == "completed" else "incomplete"
        if self.audio_mode:
            content = [ContentPart(type="output_audio", transcript=self.transcript)]
        else:
            content = [ContentPart(type="output_text", text=self.transcript)]
        final_item = MessageItem(id=item.id, role="assistant", status=item.status, content=content)
        if outcome.status == "completed":
            if self.audio_mode:
                self.sender.event(self._content(OutputAudioDone))
                self.sender.event(self._content(OutputAudioTranscriptDone, transcript=self.transcript))
                part = OutputPart(type="audio", transcript=self.transcript)
            else:
                self.sender.event(self._content(OutputTextDone, text=self.transcript))
                part = OutputPart(type="text", text=self.transcript)
            self.sender.event(self._content(ContentPartDone, part=part))
        self.sender.event(OutputItemDone(response_id=r.id, item=final_item))
        self.sender.event(ConversationItemDone(item=final_item))
        details = None
        if outcome.status != "completed":
            details = StatusDetails(type=outcome.status, reason=outcome.reason, error=outcome.error)
        done = RealtimeResponse(id=r.id, status=outcome.status, status_details=details, output=[final_item], usage=usage,
                                metadata=r.metadata)
        self.sender.event(ResponseDone(response=done))
        log.info("response %s %s (%s): %d ms of audio", r.id, outcome.status, outcome.reason or "-", item.audio_ms)


@contextlib.contextmanager
def _slow_consumer_if_full() -> Iterator[None]:
    try:
        yield
    except OutboxFull as e:
        raise SlowConsumer from e


def _usage(t: Timings) -> Usage:
    return Usage(
        total_tokens=t.prompt_tokens + t.completion_tokens + t.codec_frames,
        input_tokens=t.prompt_tokens,
        output_tokens=t.completion_tokens + t.codec_frames,
        input_token_details=InputTokenDetails(
            text_tokens=t.prompt_tokens - t.prompt_audio_tokens, audio_tokens=t.prompt_audio_tokens,
            cached_tokens=t.cached_tokens,
        ),
        output_token_details=OutputTokenDetails(text_tokens=t.completion_tokens, audio_tokens=t.codec_frames),
    )
