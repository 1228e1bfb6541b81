"""One realtime response: runs the engine request and streams its transcript and audio as events.

Audio leaves in the session's output format: PCM16 or G.711 as
`response.output_audio.delta` events, or Opus as binary packets (our extension).
A cancelled response (barge-in, `response.cancel`, a slow reader) stops at once:
the engine request is aborted and its queued audio dropped by the session.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import soxr

from engine import (
    AudioChunk,
    Engine,
    EngineError,
    EngineRequest,
    Failed,
    Finished,
    Message,
    SamplingParams,
    TextDelta,
)
from voice_gateway.audio.g711 import alaw_encode, ulaw_encode
from voice_gateway.audio.opus import OpusStream
from voice_gateway.audio.wav import float_to_pcm16
from voice_gateway.realtime.conversation import Item
from voice_gateway.realtime.events import (
    AudioFormat,
    ContentPart,
    ContentPartAdded,
    ContentPartDone,
    ConversationItemAdded,
    ConversationItemDone,
    ErrorDetail,
    InputTokenDetails,
    MessageItem,
    OutputAudioDelta,
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

if TYPE_CHECKING:
    from voice_gateway.realtime.session import AudioOut

log = logging.getLogger(__name__)

SAMPLE_RATE_HZ = 24_000


class SlowConsumer(Exception):
    pass


@dataclass(slots=True)
class ResponseOutcome:
    status: str = "completed"  # completed | cancelled | failed
    reason: str | None = None
    error: ErrorDetail | None = None


@dataclass(slots=True)
class Response:
    """A response's state; the session owns it and may cancel it."""

    id: str
    item: Item
    config: SessionConfig
    speech_stopped_at: float | None = None  # perf_counter of the VAD stop that triggered it
    first_audio_at: float | None = None
    outcome: ResponseOutcome = field(default_factory=ResponseOutcome)
    task: asyncio.Task | None = None

    @staticmethod
    def new(item: Item, config: SessionConfig, speech_stopped_at: float | None) -> Response:
        return Response(f"resp_{uuid.uuid4().hex[:20]}", item, config, speech_stopped_at)


class ResponseRunner:
    """Streams one response. `send` queues a JSON event; `send_binary` an Opus packet (may raise OutboxFull)."""

    def __init__(
        self,
        engine: Engine,
        response: Response,
        send: Callable[[ServerEvent, str | None], None],
        send_binary: Callable[[bytes, str], None],
        opus: OpusStream | None,
        audio_out: AudioOut | None = None,
    ) -> None:
        self.engine = engine
        self.r = response
        self.send = send
        self.send_binary = send_binary
        self.opus = opus
        self.audio_out = audio_out
        self.audio_mode = response.config.output_modality == "audio"
        self.transcript = ""
        self.audio_samples = 0
        self._g711_resampler: soxr.ResampleStream | None = None

    def _content(self, event_cls, **fields) -> ServerEvent:
        return event_cls(response_id=self.r.id, item_id=self.r.item.id, **fields)

    async def run(self, messages: tuple[Message, ...], previous_item_id: str | None) -> None:
        r, item = self.r, self.r.item
        self.send(ResponseCreated(response=RealtimeResponse(id=r.id)), None)
        announced = MessageItem(id=item.id, role="assistant", status="in_progress")
        self.send(OutputItemAdded(response_id=r.id, item=announced), None)
        self.send(ConversationItemAdded(item=announced, previous_item_id=previous_item_id), None)
        part = OutputPart(type="audio", transcript="") if self.audio_mode else OutputPart(type="text", text="")
        self.send(self._content(ContentPartAdded, part=part), None)
        usage = Usage()
        try:
            usage = await self._stream(messages)
        except asyncio.CancelledError:
            r.outcome.status = "cancelled"
        except SlowConsumer:
            r.outcome = ResponseOutcome("failed", None, ErrorDetail(type="server_error", code="slow_consumer",
                                                                    message="the client did not read fast enough"))
        except EngineError as e:
            r.outcome = ResponseOutcome("failed", None, ErrorDetail(code=e.code or "invalid_request", message=str(e)))
        self._finish(usage)

    async def _stream(self, messages: tuple[Message, ...]) -> Usage:
        cfg = self.r.config
        max_tokens = None if cfg.max_output_tokens == "inf" else cfg.max_output_tokens
        request = EngineRequest(
            request_id=self.r.id,
            messages=messages,
            want_audio=self.audio_mode,
            speaker=cfg.voice,
            sampling=SamplingParams(max_tokens=max_tokens, temperature=cfg.temperature),
        )
        stream = await self.engine.submit(request)
        if self.opus is not None:
            self.opus.start_response()
        try:
            async for event in stream:
                if isinstance(event, TextDelta):
                    self.transcript += event.text
                    delta_cls = OutputAudioTranscriptDelta if self.audio_mode else OutputTextDelta
                    self.send(self._content(delta_cls, delta=event.text), None)
                elif isinstance(event, AudioChunk):
                    self._send_audio(event.samples)
                elif isinstance(event, Finished):
                    if self.opus is not None:
                        for packet in self.opus.flush():
                            self._queue_binary(packet.pack())
                    t = event.timings
                    return Usage(
                        total_tokens=t.prompt_tokens + t.completion_tokens + t.codec_frames,
                        input_tokens=t.prompt_tokens,
                        output_tokens=t.completion_tokens + t.codec_frames,
                        input_token_details=InputTokenDetails(
                            text_tokens=t.prompt_tokens - t.prompt_audio_tokens, audio_tokens=t.prompt_audio_tokens
                        ),
                        output_token_details=OutputTokenDetails(text_tokens=t.completion_tokens, audio_tokens=t.codec_frames),
                    )
                elif isinstance(event, Failed):
                    self.r.outcome = ResponseOutcome("failed", None, ErrorDetail(type="server_error", code="engine_failed",
                                                                                 message=event.reason))
            return Usage()
        finally:
            await stream.aclose()

    def _send_audio(self, samples: np.ndarray) -> None:
        if self.r.first_audio_at is None:
            self.r.first_audio_at = time.perf_counter()
        self.audio_samples += samples.size
        if self.audio_out is not None:
            self.audio_out.push(samples, self.r.id)
            return
        fmt = self.r.config.output_audio_format
        if fmt is AudioFormat.OPUS:
            assert self.opus is not None
            for packet in self.opus.encode(samples):
                self._queue_binary(packet.pack())
            return
        if fmt is AudioFormat.PCM16:
            data = float_to_pcm16(samples)
        else:
            if self._g711_resampler is None:
                self._g711_resampler = soxr.ResampleStream(SAMPLE_RATE_HZ, 8000, 1, dtype="float32", quality="HQ")
            narrow = self._g711_resampler.resample_chunk(samples.astype(np.float32))
            data = (ulaw_encode if fmt is AudioFormat.G711_ULAW else alaw_encode)(narrow)
        try:
            self.send(self._content(OutputAudioDelta, delta=data), self.r.id)
        except OutboxFull as e:
            raise SlowConsumer from e

    def _queue_binary(self, data: bytes) -> None:
        try:
            self.send_binary(data, self.r.id)
        except OutboxFull as e:
            raise SlowConsumer from e

    def _finish(self, usage: Usage) -> None:
        r, item, outcome = self.r, self.r.item, self.r.outcome
        item.text = self.transcript
        item.audio_ms = self.audio_samples * 1000 // SAMPLE_RATE_HZ
        item.status = "completed" if outcome.status == "completed" else "incomplete"
        kind = "output_audio" if self.audio_mode else "output_text"
        content = [ContentPart(type=kind, transcript=self.transcript) if self.audio_mode else ContentPart(type=kind, text=self.transcript)]
        final_item = MessageItem(id=item.id, role="assistant", status=item.status, content=content)
        if outcome.status == "completed":
            if self.audio_mode:
                self.send(self._content(OutputAudioDone), None)
                self.send(self._content(OutputAudioTranscriptDone, transcript=self.transcript), None)
                part = OutputPart(type="audio", transcript=self.transcript)
            else:
                self.send(self._content(OutputTextDone, text=self.transcript), None)
                part = OutputPart(type="text", text=self.transcript)
            self.send(self._content(ContentPartDone, part=part), None)
        self.send(OutputItemDone(response_id=r.id, item=final_item), None)
        self.send(ConversationItemDone(item=final_item), None)
        details = None
        if outcome.status != "completed":
            details = StatusDetails(type=outcome.status, reason=outcome.reason, error=outcome.error)
        done = RealtimeResponse(id=r.id, status=outcome.status, status_details=details, output=[final_item], usage=usage)
        self.send(ResponseDone(response=done), None)
        log.info("response %s %s (%s): %d ms of audio", r.id, outcome.status, outcome.reason or "-", item.audio_ms)
