"""A realtime session: client events in, server events out; knows nothing about sockets.

It owns the session config, the input audio buffer, turn taking, the
conversation, the one active response, the transcriptions in flight, the audio
sink and the outbox the transport drains. WebSocket and WebRTC adapters share it: each decodes a frame
(`frames.deliver`), `handle`s the event, and writes out what the outbox holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from engine import INPUT_SAMPLE_RATE_HZ, Engine, Message
from voice_gateway.config import GatewayConfig
from voice_gateway.metrics import GatewayMetrics
from voice_gateway.realtime import events as ev
from voice_gateway.realtime import item_events
from voice_gateway.realtime.audio_sinks import AudioSink, TrackSink, event_sink
from voice_gateway.realtime.conversation import Conversation, Item, audio_ms, new_item_id
from voice_gateway.realtime.idle import IdleTimer
from voice_gateway.realtime.input_buffer import BufferFull, InputAudioBuffer
from voice_gateway.realtime.item_shapes import protocol_item
from voice_gateway.realtime.out_of_band import ResponseContext, response_context
from voice_gateway.realtime.outbox import Delivery, Outbox
from voice_gateway.realtime.response import CancelReason, Response, ResponseRunner
from voice_gateway.realtime.sender import EventSender
from voice_gateway.realtime.tools import response_tool_error, settle_tools
from voice_gateway.realtime.transcription import Transcriber
from voice_gateway.realtime.turns import TurnTaking
from voice_gateway.realtime.voices import UnknownVoice, resolve_voice
from voice_gateway.text import MAX_CHARS_PER_TOKEN

log = logging.getLogger(__name__)

_MIN_COMMIT_MS = 100  # OpenAI refuses to commit less than 100 ms of audio
# OpenAI's text: LiveKit recognises the barge-in race (a cancel after the reply ended) by its start
CANCEL_NOT_ACTIVE = "Cancellation failed: no active response found"
# Room left in the context for the reply when history is trimmed (the engine has the final word).
_REPLY_TOKENS_RESERVE = 256


class Session:
    """Owns one connection's config, input buffer, turn taking, conversation, active response, sinks and outbox."""

    def __init__(
        self, engine: Engine, gateway: GatewayConfig, dialect: ev.Dialect, metrics: GatewayMetrics, transport: str,
        *, audio_on_track: bool = False,
    ) -> None:
        self.engine = engine
        self.gateway = gateway
        self.dialect = dialect
        self.metrics = metrics
        self.transport = transport
        self.config = ev.SessionConfig(model=engine.info.model_id)
        self.outbox = Outbox(gateway.send_queue_messages)
        self.sender = EventSender(self.outbox, dialect)
        self.buffer = InputAudioBuffer(gateway.max_input_buffer_s)
        self.turns = TurnTaking()
        self.turns.configure(self.config.turn_detection, 0)
        self.conversation = Conversation(engine.info.max_model_len - _REPLY_TOKENS_RESERVE,
                                         int(gateway.max_stored_audio_s * INPUT_SAMPLE_RATE_HZ))
        self.response: Response | None = None
        self.transcriber = Transcriber(engine, self.sender, self.config.id)
        self.idle = IdleTimer()
        # WebRTC plays replies on a media track, whatever the output format; WebSockets get one sink per format
        self.track = TrackSink(self.sender) if audio_on_track else None
        self._sinks: dict[ev.AudioFormat, AudioSink] = {}

    @property
    def id(self) -> str:
        return self.config.id

    # -- output
    def error(self, code: str, message: str, *, event_id: str | None = None, param: str | None = None) -> None:
        self.protocol_error(ev.ProtocolError(code, message, event_id, param))

    def protocol_error(self, e: ev.ProtocolError) -> None:
        """Every error the client is told of passes here: counted, logged with the session id, sent."""
        self.metrics.protocol_errors.labels(e.code).inc()
        log.info("session %s error %s (param %s, event %s): %s", self.id, e.code, e.param or "-", e.event_id or "-",
                 e.message)
        self.sender.event(ev.ErrorEvent.from_protocol_error(e))

    def _sink_for(self, fmt: ev.AudioFormat) -> AudioSink:
        """One sink per format, kept for the session: Opus's packet counters run on across responses."""
        if self.track is not None:
            return self.track
        if fmt not in self._sinks:
            self._sinks[fmt] = event_sink(fmt, self.sender, self.gateway.opus_bitrate_bps)
        return self._sinks[fmt]

    # -- lifecycle
    def open(self) -> None:
        log.info("session %s opened (%s, %s)", self.id, self.transport, self.dialect.value)
        self._sink_for(self.config.output_audio_format)
        self.sender.event(ev.SessionCreated(session=self.config))

    async def close(self) -> None:
        self.idle.disarm()
        if self.response is not None:
            await self.cancel_response("client_cancelled")
        await self.transcriber.close()
        # A transport may keep the session until the cyclic GC runs (aiortc's peer connection and its
        # handlers form cycles): the audio goes now, whoever still holds the session.
        self.buffer.clear()
        self.conversation.release_audio()
        self.outbox.close()
        log.info("session %s closed", self.id)

    # -- input
    async def handle(self, event: ev.ClientEvent) -> None:
        await _HANDLERS[type(event)](self, event)

    async def _session_update(self, event: ev.SessionUpdate) -> None:
        """A rejected setting is reported and left as it was; the rest of the update applies."""
        for rejected in event.rejected:
            self.protocol_error(rejected)
        try:
            config = ev.apply_session_update(self.config, event)
        except ev.ProtocolError as e:
            self.protocol_error(e)
            return
        if not self.text_fits(event.session.instructions, "instructions", event.event_id, "session.instructions"):
            config = config.model_copy(update={"instructions": self.config.instructions})
        if config.voice != self.config.voice and not self._voice_exists(config.voice, event.event_id, "session"):
            config = config.model_copy(update={"voice": self.config.voice})
        config, tool_errors = settle_tools(self.config, config, event.event_id)
        for error in tool_errors:
            self.protocol_error(error)
        if config.turn_detection is None or config.turn_detection.idle_timeout_ms is None:
            self.idle.disarm()
        vad_changed = config.turn_detection != self.config.turn_detection
        self.config = config
        if vad_changed:
            self.turns.configure(config.turn_detection, self.buffer.end_ms)  # a new VAD counts from now
        self._sink_for(config.output_audio_format)
        self.sender.event(ev.SessionUpdated(session=self.config))

    async def _append(self, event: ev.InputAudioAppend) -> None:
        if len(event.audio) > self.gateway.max_append_bytes:
            self.error("audio_too_large", f"one append may carry at most {self.gateway.max_append_bytes} bytes",
                       event_id=event.event_id, param="audio")
            return
        try:
            samples = self.buffer.decode(event.audio, self.config.input_audio_format)
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
        for change in await self.turns.feed(samples):
            self.sender.event(change)
            if isinstance(change, ev.SpeechStarted):
                await self._speech_started()
            else:
                await self._speech_stopped(change)

    def _voice_exists(self, voice: str | None, event_id: str | None, where: str) -> bool:
        if voice is None:
            return True
        try:
            resolve_voice(voice, self.engine.info.speakers)
        except UnknownVoice as e:
            param = f"{where}.voice" if self.dialect is ev.Dialect.BETA else f"{where}.audio.output.voice"
            self.error("invalid_value", str(e), event_id=event_id, param=param)
            return False
        return True

    async def _speech_started(self) -> None:
        self.idle.disarm()
        td = self.config.turn_detection
        assert td is not None, "speech detected without turn detection"
        if td.interrupt_response:
            if self.response is not None:
                await self.cancel_response("turn_detected")
            elif self.track is not None and self.track.playing is not None:
                # generation finished but its audio still plays out: stop that too
                self._clear_playback(self.track.playing)

    async def _speech_stopped(self, stopped: ev.SpeechStopped) -> None:
        td = self.config.turn_detection
        assert td is not None, "speech detected without turn detection"
        stopped_at = time.perf_counter()
        samples = self.buffer.take_until(stopped.audio_end_ms, self.turns.start_ms - td.prefix_padding_ms)
        self._commit_audio(samples, stopped.item_id)
        if td.create_response and self.response is None:
            self._start_response(self.config, stopped_at)

    async def _commit(self, event: ev.InputAudioCommit) -> None:
        if self.buffer.duration_ms < _MIN_COMMIT_MS:
            self.error("input_audio_buffer_commit_empty",
                       f"buffer too small: {self.buffer.duration_ms} ms of audio, at least {_MIN_COMMIT_MS} ms needed",
                       event_id=event.event_id)
            return
        self._commit_audio(self.buffer.take_all(), self.turns.take_item_id(), event.event_id)

    def _commit_audio(self, samples: np.ndarray, item_id: str, event_id: str | None = None) -> None:
        item = Item(item_id, "user", audio=samples, audio_ms=audio_ms(samples))
        previous = self.conversation.add(item)
        self.sender.event(ev.InputAudioCommitted(item_id=item_id, previous_item_id=previous))
        self.announce_item(item, previous)
        if self.config.transcription is not None:
            self.transcriber.start(item, self.config.transcription)  # before bounding may drop the audio
        self.bound_audio(item, event_id, None)

    def bound_audio(self, added: Item, event_id: str | None, param: str | None) -> None:
        """Keep the conversation's audio within its bounds; the client hears of it when its new item's own goes."""
        self.conversation.bound_audio(self.config.instructions)
        if added.audio_dropped:
            context_s = self.conversation.context_audio_s()
            self.error("input_audio_too_long",
                       f"item {added.id} holds {added.audio_ms / 1000:.1f} s of audio; a session keeps at most "
                       f"{self.gateway.max_stored_audio_s:.0f} s, and this model's context about {context_s} s: "
                       "the item stays in the conversation without its audio, which replies will not hear",
                       event_id=event_id, param=param)

    def announce_item(self, item: Item, previous: str | None) -> None:
        message = protocol_item(item)
        self.sender.event(ev.ConversationItemAdded(item=message, previous_item_id=previous))
        self.sender.event(ev.ConversationItemDone(item=message, previous_item_id=previous))

    def _idle_timeout(self) -> None:
        """The user stayed silent after a reply: what the buffer holds is committed, and a reply asked for."""
        if self.response is not None or self.config.turn_detection is None:
            return
        item_id = self.turns.take_item_id()
        start_ms = self.buffer.start_sample * 1000 // INPUT_SAMPLE_RATE_HZ
        self.sender.event(ev.InputAudioTimeoutTriggered(audio_start_ms=start_ms, audio_end_ms=self.buffer.end_ms,
                                                        item_id=item_id))
        log.info("session %s: idle timeout, asking for a reply", self.id)
        self._commit_audio(self.buffer.take_all(), item_id)
        self._start_response(self.config, None)

    def _arm_idle_timeout(self, response: Response) -> None:
        """After a reply, once its audio has played out (as far as the server can tell) and the timeout passed."""
        td = self.config.turn_detection
        if td is None or td.type != "server_vad" or td.idle_timeout_ms is None:
            return
        played_s = time.perf_counter() - (response.first_audio_at or time.perf_counter())
        playback_left_s = max(0.0, response.item.audio_ms / 1000 - played_s)
        self.idle.arm(playback_left_s + td.idle_timeout_ms / 1000, self._idle_timeout)

    async def _clear(self, event: ev.InputAudioClear) -> None:
        self.buffer.clear()
        self.turns.forget_segment()
        self.sender.event(ev.InputAudioCleared())

    async def _response_create(self, event: ev.ResponseCreate) -> None:
        if self.response is not None:
            self.error("conversation_already_has_active_response",
                       f"Conversation already has an active response in progress: {self.response.id}. Wait until the "
                       "response is finished before creating a new one.", event_id=event.event_id)
            return
        instructions = event.response.instructions if event.response is not None else None
        if not self.text_fits(instructions, "instructions", event.event_id, "response.instructions"):
            return
        try:
            config = ev.apply_response_overrides(self.config, event)
        except ev.ProtocolError as e:
            self.protocol_error(e)
            return
        if config.voice != self.config.voice and not self._voice_exists(config.voice, event.event_id, "response"):
            return
        if (tool_error := response_tool_error(config, event.event_id)) is not None:
            self.protocol_error(tool_error)
            return
        if (context := response_context(self, event.response, event.event_id)) is None:
            return
        self._start_response(config, None, event.response.metadata if event.response is not None else None, context)

    async def _response_cancel(self, event: ev.ResponseCancel) -> None:
        if self.response is None or (event.response_id and event.response_id != self.response.id):
            self.error("response_cancel_not_active", CANCEL_NOT_ACTIVE, event_id=event.event_id)
            return
        await self.cancel_response("client_cancelled")

    async def _output_clear(self, event: ev.OutputAudioBufferClear) -> None:
        if self.track is None:
            self.error("invalid_request", "output_audio_buffer.clear is for WebRTC sessions: this one sends audio "
                       "as events", event_id=event.event_id)
            return
        playing = self.track.playing
        if self.response is not None:
            await self.cancel_response("client_cancelled")  # clears the track too
        elif playing is not None:
            self._clear_playback(playing)

    def text_fits(self, text: str | None, what: str, event_id: str | None, param: str) -> bool:
        """Text that cannot fit the context is refused by its length alone, before any tokenizer sees it."""
        context_tokens = self.engine.info.max_model_len
        if text is None or len(text) <= MAX_CHARS_PER_TOKEN * context_tokens:
            return True
        self.error("context_length_exceeded",
                   f"{len(text)} characters of {what} need at least {-(-len(text) // MAX_CHARS_PER_TOKEN)} tokens; "
                   f"this model's context is {context_tokens} tokens", event_id=event_id, param=param)
        return False

    # -- responses
    def _start_response(self, config: ev.SessionConfig, speech_stopped_at: float | None,
                        metadata: dict[str, str] | None = None, context: ResponseContext = ResponseContext()) -> None:
        self.idle.disarm()
        item = Item(new_item_id(), "assistant", status="in_progress")
        messages = context.messages(self.conversation, config.instructions)
        self.conversation.bound_audio(config.instructions)  # the audio this prompt left out goes
        # voices were checked when set: an engine that lost the speaker since answers the request itself
        speaker = config.voice
        if speaker is not None:
            with contextlib.suppress(UnknownVoice):
                speaker = resolve_voice(speaker, self.engine.info.speakers)
        response = Response.new(item, config, self._sink_for(config.output_audio_format), speech_stopped_at,
                                speaker, metadata)
        self.response = response
        runner = ResponseRunner(self.engine, response, *context.output_to(self.conversation, self.sender))
        response.task = asyncio.create_task(self._run(runner, messages))

    async def _run(self, runner: ResponseRunner, messages: tuple[Message, ...]) -> None:
        response = runner.r
        try:
            await runner.run(messages)
        finally:
            if self.response is response:
                self.response = None
            if response.outcome.delivery is Delivery.SLOW_CONSUMER:
                response.sink.cancel()
                self.error(Delivery.SLOW_CONSUMER.value,
                           f"response {response.id} cancelled: the client did not read fast enough")
            if response.outcome.status != "completed":
                self.metrics.cancelled_responses.labels(response.outcome.reason or response.outcome.status).inc()
            else:
                if response.speech_stopped_at is not None and response.first_audio_at is not None:
                    self.metrics.turn_latency.observe(response.first_audio_at - response.speech_stopped_at)
                if self.response is None:
                    self._arm_idle_timeout(response)

    def _clear_playback(self, response_id: str) -> None:
        assert self.track is not None, "only a track plays audio out"
        self.track.cancel()
        self.sender.event(ev.OutputAudioBufferCleared(response_id=response_id))

    async def cancel_response(self, reason: CancelReason) -> None:
        """Stop the active response now: no more of its audio leaves, the engine frees it."""
        response = self.response
        if response is None or response.task is None:
            return
        self.response = None
        response.outcome.reason = reason
        if self.track is not None:
            dropped = 0
            self._clear_playback(response.id)
        else:
            dropped = response.sink.cancel()
        response.task.cancel()
        await asyncio.gather(response.task, return_exceptions=True)
        log.info("session %s: response %s cancelled (%s), %d queued messages dropped", self.id, response.id, reason, dropped)


# Unbound, at module level: bound methods kept in an instance dict would make a Session <-> handler cycle,
# and only the cyclic GC would free a closed session's audio.
_HANDLERS: dict[type, Callable[[Session, Any], Awaitable[None]]] = {
    ev.SessionUpdate: Session._session_update,
    ev.InputAudioAppend: Session._append,
    ev.InputAudioCommit: Session._commit,
    ev.InputAudioClear: Session._clear,
    ev.ConversationItemCreate: item_events.create,
    ev.ConversationItemDelete: item_events.delete,
    ev.ConversationItemRetrieve: item_events.retrieve,
    ev.ConversationItemTruncate: item_events.truncate,
    ev.ResponseCreate: Session._response_create,
    ev.ResponseCancel: Session._response_cancel,
    ev.OutputAudioBufferClear: Session._output_clear,
}

