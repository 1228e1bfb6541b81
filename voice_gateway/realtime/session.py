"""A realtime session: client events in, server events out; knows nothing about sockets.

It owns the session config, the input audio buffer and its VAD, the
conversation, the one active response and the outbox the transport drains.
WebSocket and WebRTC adapters share it: frame -> `handle` -> outbox -> frame.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

import numpy as np

from engine import Engine
from voice_gateway.audio.g711 import alaw_decode, ulaw_decode
from voice_gateway.audio.opus import OpusStream
from voice_gateway.audio.vad import ServerVad, VadConfig
from voice_gateway.audio.vad import SpeechStarted as VadStarted
from voice_gateway.audio.wav import pcm16_to_float
from voice_gateway.config import GatewayConfig
from voice_gateway.metrics import GatewayMetrics
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.conversation import Conversation, Item, audio_ms, new_item_id
from voice_gateway.realtime.input_buffer import BufferFull, InputAudioBuffer
from voice_gateway.realtime.outbox import Outbox
from voice_gateway.realtime.response import Response, ResponseRunner

log = logging.getLogger(__name__)

_MIN_COMMIT_MS = 100  # OpenAI refuses to commit less than 100 ms of audio
# Room left in the context for the reply when history is trimmed (the engine has the final word).
_REPLY_TOKENS_RESERVE = 256


class AudioOut(Protocol):
    """Where a transport that plays audio itself (WebRTC) takes reply audio: 24 kHz float32."""

    playing: str | None  # the response whose audio is still going out, if any

    def push(self, samples: np.ndarray, response_id: str) -> None: ...

    def clear(self) -> None: ...


class Session:
    def __init__(
        self, engine: Engine, gateway: GatewayConfig, dialect: ev.Dialect, metrics: GatewayMetrics, transport: str
    ) -> None:
        self.engine = engine
        self.gateway = gateway
        self.dialect = dialect
        self.metrics = metrics
        self.transport = transport
        self.config = ev.SessionConfig(model=engine.info.model_id)
        self.outbox = Outbox(gateway.send_queue_messages)
        self.buffer = InputAudioBuffer(gateway.max_input_buffer_s)
        self.conversation = Conversation()
        self.response: Response | None = None
        self.vad: ServerVad | None = None
        self.vad_offset_ms = 0
        self.speech_item_id: str | None = None
        self.speech_start_ms = 0
        self.opus: OpusStream | None = None
        # WebRTC plays replies on a media track instead of sending audio events
        self.audio_out: AudioOut | None = None
        self._configure_audio()
        self._handlers = {
            ev.SessionUpdate: self._session_update,
            ev.InputAudioAppend: self._append,
            ev.InputAudioCommit: self._commit,
            ev.InputAudioClear: self._clear,
            ev.ConversationItemCreate: self._item_create,
            ev.ConversationItemTruncate: self._truncate,
            ev.ResponseCreate: self._response_create,
            ev.ResponseCancel: self._response_cancel,
            ev.OutputAudioBufferClear: self._output_clear,
        }

    @property
    def id(self) -> str:
        return self.config.id

    # -- output
    def send(self, event: ev.ServerEvent, response_id: str | None = None) -> None:
        """Queue an event; response audio (with `response_id`) may be refused by a full outbox."""
        text = ev.serialize(event, self.dialect)
        if text is not None:
            self.outbox.put(text, response_id, force=response_id is None)

    def send_binary(self, data: bytes, response_id: str) -> None:
        self.outbox.put(data, response_id)

    def error(self, code: str, message: str, *, event_id: str | None = None, param: str | None = None) -> None:
        self.metrics.protocol_errors.labels(code).inc()
        log.info("session %s error %s: %s", self.id, code, message)
        self.send(ev.ErrorEvent(error=ev.ErrorDetail(code=code, message=message, param=param, event_id=event_id)))

    # -- lifecycle
    def open(self) -> None:
        log.info("session %s opened (%s, %s)", self.id, self.transport, self.dialect.value)
        self.send(ev.SessionCreated(session=self.config))

    async def close(self) -> None:
        if self.response is not None:
            await self.cancel_response("client_cancelled")
        self.outbox.close()
        log.info("session %s closed", self.id)

    # -- input
    async def handle(self, raw: str | bytes) -> None:
        if len(raw) > self.gateway.max_append_bytes * 4 // 3 + 4096:
            self.error("message_too_large", f"messages are limited to {self.gateway.max_append_bytes} bytes of audio")
            return
        try:
            event = ev.parse_client_event(raw)
        except ev.ProtocolError as e:
            self.metrics.protocol_errors.labels(e.code).inc()
            self.send(ev.ErrorEvent.from_protocol_error(e))
            return
        await self._handlers[type(event)](event)

    async def _session_update(self, event: ev.SessionUpdate) -> None:
        try:
            config = ev.apply_session_update(self.config, event)
        except ev.ProtocolError as e:
            self.send(ev.ErrorEvent.from_protocol_error(e))
            return
        if config.voice is not None and config.voice.lower() not in self.engine.info.speakers:
            voices = ", ".join(self.engine.info.speakers)
            self.error("invalid_value", f"unknown voice {config.voice!r}; available: {voices}",
                       event_id=event.event_id, param="session.voice")
            return
        vad_changed = config.turn_detection != self.config.turn_detection
        self.config = config
        if vad_changed:
            self._configure_vad()
        self._configure_audio()
        self.send(ev.SessionUpdated(session=self.config))

    def _configure_vad(self) -> None:
        td = self.config.turn_detection
        self.vad = None if td is None else ServerVad(VadConfig(td.threshold, td.prefix_padding_ms, td.silence_duration_ms))
        self.vad_offset_ms = self.buffer.end_ms  # a new VAD counts from now on the session clock
        self.speech_item_id = None

    def _configure_audio(self) -> None:
        if self.vad is None and self.config.turn_detection is not None:
            self._configure_vad()
        if self.config.output_audio_format is ev.AudioFormat.OPUS and self.opus is None:
            self.opus = OpusStream(bitrate_bps=self.gateway.opus_bitrate_bps)

    async def _append(self, event: ev.InputAudioAppend) -> None:
        if len(event.audio) > self.gateway.max_append_bytes:
            self.error("audio_too_large", f"one append may carry at most {self.gateway.max_append_bytes} bytes",
                       event_id=event.event_id, param="audio")
            return
        try:
            samples = self._decode_input(event.audio)
        except ValueError as e:
            self.error("invalid_audio", str(e), event_id=event.event_id, param="audio")
            return
        await self.append_audio(samples, event.event_id)

    async def append_audio(self, samples: np.ndarray, event_id: str | None = None) -> None:
        """16 kHz float32 speech into the buffer and the VAD (WebRTC's microphone comes in here)."""
        try:
            self.buffer.append(samples)
        except BufferFull as e:
            self.error("input_audio_buffer_full", str(e), event_id=event_id)
            return
        if self.vad is not None:
            for change in self.vad.feed(samples):
                if isinstance(change, VadStarted):
                    await self._speech_started(change.audio_start_ms + self.vad_offset_ms)
                else:
                    await self._speech_stopped(change.audio_end_ms + self.vad_offset_ms)

    def _decode_input(self, data: bytes) -> np.ndarray:
        fmt = self.config.input_audio_format
        if fmt is ev.AudioFormat.PCM16:
            return self.buffer.to_16k(pcm16_to_float(data), 24_000)
        decode = ulaw_decode if fmt is ev.AudioFormat.G711_ULAW else alaw_decode
        return self.buffer.to_16k(decode(data), 8000)

    async def _speech_started(self, start_ms: int) -> None:
        td = self.config.turn_detection
        assert td is not None
        self.speech_item_id, self.speech_start_ms = new_item_id(), start_ms
        self.send(ev.SpeechStarted(audio_start_ms=start_ms, item_id=self.speech_item_id))
        if td.interrupt_response:
            if self.response is not None:
                await self.cancel_response("turn_detected")
            elif self.audio_out is not None and self.audio_out.playing is not None:
                # generation finished but its audio still plays out: stop that too
                self._clear_playback(self.audio_out.playing)

    async def _speech_stopped(self, end_ms: int) -> None:
        td = self.config.turn_detection
        assert td is not None
        stopped_at = time.perf_counter()
        item_id = self.speech_item_id or new_item_id()
        self.speech_item_id = None
        self.send(ev.SpeechStopped(audio_end_ms=end_ms, item_id=item_id))
        samples = self.buffer.take_until(end_ms, self.speech_start_ms - td.prefix_padding_ms)
        self._commit_audio(samples, item_id)
        if td.create_response and self.response is None:
            self._start_response(self.config, stopped_at)

    async def _commit(self, event: ev.InputAudioCommit) -> None:
        if self.buffer.duration_ms < _MIN_COMMIT_MS:
            self.error("input_audio_buffer_commit_empty",
                       f"buffer too small: {self.buffer.duration_ms} ms of audio, at least {_MIN_COMMIT_MS} ms needed",
                       event_id=event.event_id)
            return
        self._commit_audio(self.buffer.take_all(), self.speech_item_id or new_item_id())
        self.speech_item_id = None

    def _commit_audio(self, samples: np.ndarray, item_id: str) -> None:
        item = Item(item_id, "user", audio=samples, audio_ms=audio_ms(samples))
        previous = self.conversation.add(item)
        self.send(ev.InputAudioCommitted(item_id=item_id, previous_item_id=previous))
        self._announce_item(item, previous)

    def _announce_item(self, item: Item, previous: str | None) -> None:
        part = ev.ContentPart(type="input_audio") if item.audio is not None else ev.ContentPart(
            type="input_text" if item.role == "user" else "output_text", text=item.text)
        message = ev.MessageItem(id=item.id, role=item.role, status="completed", content=[part])
        self.send(ev.ConversationItemAdded(item=message, previous_item_id=previous))
        self.send(ev.ConversationItemDone(item=message, previous_item_id=previous))

    async def _clear(self, event: ev.InputAudioClear) -> None:
        self.buffer.clear()
        self.speech_item_id = None
        self.send(ev.InputAudioCleared())

    async def _item_create(self, event: ev.ConversationItemCreate) -> None:
        src = event.item
        text = "".join(p.text or p.transcript or "" for p in src.content)
        audio = [p.audio for p in src.content if p.audio]
        try:
            samples = self._decode_input(b"".join(audio)) if audio else None
        except ValueError as e:
            self.error("invalid_audio", str(e), event_id=event.event_id, param="item.content")
            return
        item = Item(src.id or new_item_id(), src.role, text=text, audio=samples,
                    audio_ms=audio_ms(samples) if samples is not None else 0)
        if self.conversation.get(item.id) is not None:
            self.error("item_exists", f"item {item.id} already exists", event_id=event.event_id, param="item.id")
            return
        try:
            previous = self.conversation.add(item, event.previous_item_id)
        except KeyError:
            self.error("item_not_found", f"previous_item_id {event.previous_item_id} is not in the conversation",
                       event_id=event.event_id, param="previous_item_id")
            return
        self._announce_item(item, previous)

    async def _truncate(self, event: ev.ConversationItemTruncate) -> None:
        try:
            self.conversation.truncate(event.item_id, event.audio_end_ms)
        except KeyError:
            self.error("item_not_found", f"no item {event.item_id}", event_id=event.event_id, param="item_id")
            return
        except ValueError as e:
            self.error("invalid_value", str(e), event_id=event.event_id, param="audio_end_ms")
            return
        self.send(ev.ConversationItemTruncated(item_id=event.item_id, content_index=event.content_index,
                                               audio_end_ms=event.audio_end_ms))

    async def _response_create(self, event: ev.ResponseCreate) -> None:
        if self.response is not None:
            self.error("conversation_already_has_active_response",
                       f"response {self.response.id} is still in progress", event_id=event.event_id)
            return
        try:
            config = ev.apply_response_overrides(self.config, event)
        except ev.ProtocolError as e:
            self.send(ev.ErrorEvent.from_protocol_error(e))
            return
        self._start_response(config, None)

    async def _response_cancel(self, event: ev.ResponseCancel) -> None:
        if self.response is None or (event.response_id and event.response_id != self.response.id):
            self.error("response_cancel_not_active", "there is no active response to cancel", event_id=event.event_id)
            return
        await self.cancel_response("client_cancelled")

    async def _output_clear(self, event: ev.OutputAudioBufferClear) -> None:
        if self.audio_out is None:
            self.error("invalid_request", "output_audio_buffer.clear is for WebRTC sessions: this one sends audio "
                       "as events", event_id=event.event_id)
            return
        playing = self.audio_out.playing
        if self.response is not None:
            await self.cancel_response("client_cancelled")  # clears the track too
        elif playing is not None:
            self._clear_playback(playing)

    # -- responses
    def _start_response(self, config: ev.SessionConfig, speech_stopped_at: float | None) -> None:
        item = Item(new_item_id(), "assistant", status="in_progress")
        budget = self.engine.info.max_model_len - _REPLY_TOKENS_RESERVE
        messages = self.conversation.to_messages(config.instructions, budget)
        previous = self.conversation.add(item)
        response = Response.new(item, config, speech_stopped_at)
        runner = ResponseRunner(self.engine, response, self.send, self.send_binary, self.opus, self.audio_out)
        self.response = response
        response.task = asyncio.create_task(self._run(runner, messages, previous))

    async def _run(self, runner: ResponseRunner, messages, previous: str | None) -> None:
        response = runner.r
        try:
            await runner.run(messages, previous)
        finally:
            if self.response is response:
                self.response = None
            error = response.outcome.error
            if error is not None and error.code == "slow_consumer":
                self.outbox.drop(response.id)
                self.error("slow_consumer", f"response {response.id} cancelled: the client did not read fast enough")
            if response.outcome.status != "completed":
                self.metrics.cancelled_responses.labels(response.outcome.reason or response.outcome.status).inc()
            elif response.speech_stopped_at is not None and response.first_audio_at is not None:
                self.metrics.turn_latency.observe(response.first_audio_at - response.speech_stopped_at)

    def _clear_playback(self, response_id: str) -> None:
        assert self.audio_out is not None
        self.audio_out.clear()
        self.send(ev.OutputAudioBufferCleared(response_id=response_id))

    async def cancel_response(self, reason: str) -> None:
        """Stop the active response now: no more of its audio leaves, the engine frees it."""
        response = self.response
        if response is None or response.task is None:
            return
        self.response = None
        response.outcome.reason = reason
        dropped = self.outbox.drop(response.id)
        if self.audio_out is not None:
            self._clear_playback(response.id)
        response.task.cancel()
        await asyncio.gather(response.task, return_exceptions=True)
        log.info("session %s: response %s cancelled (%s), %d queued messages dropped", self.id, response.id, reason, dropped)
