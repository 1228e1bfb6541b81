"""A realtime session: client events in, server events out; knows nothing about sockets.

It dispatches each client event to the part that owns what the event changes, and carries what one part's
change means to another (speech started: the reply stops; speech stopped: a user item, then a reply). Its
parts: `settings` (the SessionConfig), `audio_input` (the input buffer and turn detection), `items` (the
conversation and its transcriptions), `responses` (the responses in flight), `audio_out` (the reply sinks),
`outbox` (what the transport writes out) and `idle` (server VAD's idle timeout). The WebSocket and WebRTC
adapters each decode a frame (`frames.deliver`), `handle` the event, and write out what the outbox holds."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from engine import INPUT_SAMPLE_RATE_HZ, AudioPart, Engine, Message
from voice_gateway.audio.semantic_vad import ProbableEnd, Resumed
from voice_gateway.config import GatewayConfig
from voice_gateway.metrics import GatewayMetrics
from voice_gateway.realtime import events as ev
from voice_gateway.realtime import item_events
from voice_gateway.realtime.audio_input import AudioInput
from voice_gateway.realtime.audio_out import AudioOut
from voice_gateway.realtime.audio_sinks import TRACK_RATE_HZ, TrackSink
from voice_gateway.realtime.checks import RequestChecks
from voice_gateway.realtime.client_items import ClientItemReader
from voice_gateway.realtime.conversation import ContextFull, Conversation
from voice_gateway.realtime.conversation_items import ConversationItems
from voice_gateway.realtime.hearing import HearingAhead
from voice_gateway.realtime.idle import IdleTimer
from voice_gateway.realtime.input_buffer import BufferFull, InputAudioBuffer
from voice_gateway.realtime.out_of_band import ResponseContext
from voice_gateway.realtime.outbox import Outbox
from voice_gateway.realtime.reporter import ErrorReporter
from voice_gateway.realtime.response import CancelReason, Response, TurnClock
from voice_gateway.realtime.response_request import read_response_create
from voice_gateway.realtime.response_slot import ResponseSlot
from voice_gateway.realtime.sender import EventSender
from voice_gateway.realtime.settings import SessionSettings
from voice_gateway.realtime.transcription import Transcriber
from voice_gateway.realtime.turns import TurnTaking

log = logging.getLogger(__name__)

_MIN_COMMIT_MS = 100  # OpenAI refuses to commit less than 100 ms of audio
# OpenAI's text: LiveKit recognises the barge-in race (a cancel after the reply ended) by its start
CANCEL_NOT_ACTIVE = "Cancellation failed: no active response found"
# Room left in the context for the reply when history is trimmed (the engine has the final word).
_REPLY_TOKENS_RESERVE = 256


class Session:
    """One connection's realtime session: owns its parts (the module docstring lists them) and nothing else."""

    def __init__(
        self, engine: Engine, gateway: GatewayConfig, dialect: ev.Dialect, metrics: GatewayMetrics, transport: str,
        *, audio_on_track: bool = False, track_rate_hz: int = TRACK_RATE_HZ,
        camera: Callable[[], np.ndarray | None] | None = None, timing: bool = False,
    ) -> None:
        """`audio_on_track`: replies leave as 20 ms frames at `track_rate_hz` that the transport pulls (a WebRTC
        track, a phone line), not as events. `camera`: the newest frame of a call's video (RGB), which joins each
        user turn its audio commits; `timing`: spoken responses end with our `response.timing` event."""
        self.gateway = gateway
        self.dialect = dialect
        self.transport = transport
        # the model's own temperature, not OpenAI's 0.8: a small model is told apart from noise at its own
        # (the assistant's 135M model, at 0.8, begins about half its answers in French)
        # an engine that hears ahead takes turns by what was said (semantic_vad with the words of each pause)
        turn_detection = ev.TurnDetection(type="semantic_vad" if engine.info.listens_ahead else "server_vad")
        config = ev.SessionConfig(model=engine.info.model_id, temperature=engine.info.temperature,
                                  turn_detection=turn_detection)
        self.id = config.id
        self.outbox = Outbox(gateway.send_queue_messages)
        self.sender = EventSender(self.outbox, dialect)
        self.reporter = ErrorReporter(self.sender, metrics, self.id)
        self.checks = RequestChecks(engine, dialect, self.reporter)
        self.settings = SessionSettings(config, self.checks, self.reporter, self.sender)
        buffer = InputAudioBuffer(gateway.max_input_buffer_s)
        self.hearing = HearingAhead(engine, buffer, self.id) if engine.info.listens_ahead else None
        self.audio_input = AudioInput(buffer, TurnTaking(config.turn_detection, self.hearing))
        self.reader = ClientItemReader(self.settings, self.checks, self.reporter, gateway.images,
                                       takes_images=engine.info.max_image_pixels > 0,
                                       seen_pixels=engine.info.max_image_pixels,
                                       decoded=metrics.image_decode.observe)
        conversation = Conversation(engine.info.max_model_len - _REPLY_TOKENS_RESERVE,
                                    int(gateway.max_stored_audio_s * INPUT_SAMPLE_RATE_HZ),
                                    gateway.images.max_images_per_session, engine.info.max_image_pixels,
                                    cut_early=random.Random(self.id).uniform(0.0, 0.5))
        self.items = ConversationItems(conversation, Transcriber(engine, self.sender, self.id), self.settings,
                                       self.sender, self.reporter, gateway.max_stored_audio_s)
        # WebRTC and phone calls play replies on a track, whatever the output format; WebSockets get one sink per format
        track = TrackSink(self.sender, track_rate_hz) if audio_on_track else None
        self.audio_out = AudioOut(self.sender, gateway.opus_bitrate_bps, track)
        self.responses = ResponseSlot(engine, self.items, self.audio_out, self.sender, self.reporter, metrics, self.id,
                                      timing)
        self.idle = IdleTimer()
        self.camera = camera

    # -- what tests and transports read of the parts
    @property
    def config(self) -> ev.SessionConfig:
        return self.settings.config

    @property
    def response(self) -> Response | None:
        return self.responses.current

    @property
    def conversation(self) -> Conversation:
        return self.items.conversation

    @property
    def transcriber(self) -> Transcriber:
        return self.items.transcriber

    @property
    def buffer(self) -> InputAudioBuffer:
        return self.audio_input.buffer

    @property
    def turns(self) -> TurnTaking:
        return self.audio_input.turns

    @property
    def track(self) -> TrackSink | None:
        return self.audio_out.track

    def error(self, code: str, message: str, *, event_id: str | None = None, param: str | None = None) -> None:
        self.reporter.error(code, message, event_id=event_id, param=param)

    def protocol_error(self, e: ev.ProtocolError) -> None:
        self.reporter.report(e)

    # -- lifecycle
    def open(self) -> None:
        log.info("session %s opened (%s, %s)", self.id, self.transport, self.dialect.value)
        self.audio_out.sink_for(self.config.output_audio_format)
        self.sender.event(ev.SessionCreated(session=self.config))

    async def close(self) -> None:
        self.idle.disarm()
        await self.responses.cancel_all("client_cancelled")
        # A transport may keep the session until the cyclic GC runs (aiortc's peer connection and its
        # handlers form cycles): the audio goes now, whoever still holds the session.
        await self.items.close()
        self.audio_input.clear()
        self.outbox.close()
        log.info("session %s closed", self.id)

    async def handle(self, event: ev.ClientEvent) -> None:
        await _HANDLERS[type(event)](self, event)

    # -- settings
    async def _session_update(self, event: ev.SessionUpdate) -> None:
        previous = self.settings.update(event)
        if previous is None:
            return
        td = self.config.turn_detection
        if td is None or td.idle_timeout_ms is None:
            self.idle.disarm()
        if td != previous.turn_detection:
            self.audio_input.configure(td)  # a new VAD counts from now
            await self.responses.drop_early()
        self.audio_out.sink_for(self.config.output_audio_format)

    # -- input audio and turns
    async def _append(self, event: ev.InputAudioAppend) -> None:
        if len(event.audio) > self.gateway.max_append_bytes:
            self.error("audio_too_large", f"one append may carry at most {self.gateway.max_append_bytes} bytes",
                       event_id=event.event_id, param="audio")
            return
        try:
            samples = self.audio_input.decode(event.audio, self.config.input_audio_format)
        except ValueError as e:
            self.error("invalid_audio", str(e), event_id=event.event_id, param="audio")
            return
        await self.append_audio(samples, event.event_id)

    async def append_audio(self, samples: np.ndarray, event_id: str | None = None) -> None:
        """16 kHz float32 speech into the buffer and the VAD (WebRTC's microphone comes in here)."""
        try:
            changes = await self.audio_input.append(samples)
        except BufferFull as e:
            self.error("input_audio_buffer_full", str(e), event_id=event_id)
            return
        for change in changes:
            if isinstance(change, ProbableEnd):
                await self._probable_end(change)
            elif isinstance(change, Resumed):
                await self.responses.drop_early()
            elif isinstance(change, ev.SpeechStarted):
                self.sender.event(change)
                await self._speech_started()
            else:
                self.sender.event(change)
                await self._speech_stopped(change)

    async def _probable_end(self, end: ProbableEnd) -> None:
        """The turn may end here: its reply starts, unseen, on the prompt the turn's own response would have."""
        td = self.config.turn_detection
        if td is None or not td.create_response or self.response is not None:
            return
        clip = self.audio_input.turn_so_far(end.audio_end_ms, td.prefix_padding_ms)
        try:
            history = self.items.prompt(ResponseContext(), self.config)
        except ContextFull:
            return
        await self.responses.start_early(self.config, (*history, Message("user", (AudioPart(clip),))))

    async def _speech_started(self) -> None:
        self.idle.disarm()
        td = self.config.turn_detection
        assert td is not None, "speech detected without turn detection"
        if td.interrupt_response:
            if self.response is not None:
                await self.responses.cancel("turn_detected")
            elif (playing := self.audio_out.playing) is not None:
                # generation finished but its audio still plays out: stop that too
                self.audio_out.clear_playback(playing)

    async def _speech_stopped(self, stopped: ev.SpeechStopped) -> None:
        td = self.config.turn_detection
        assert td is not None, "speech detected without turn detection"
        stopped_at = time.perf_counter()
        # the audio after the speech's end is the silence the decision waited for, received at real-time pace
        waited_s = (self.audio_input.buffer.end_ms - stopped.audio_end_ms) / 1000
        heard = None if self.hearing is None else self.hearing.heard_at(stopped.audio_end_ms)
        turn = TurnClock(stopped_at - waited_s, stopped_at, heard)
        self.items.commit_audio(self.audio_input.take_turn(stopped, td.prefix_padding_ms), stopped.item_id,
                                frame=self._frame())
        if td.create_response and self.response is None:
            self._start_response(self.config, ResponseContext(), stopped_at, turn=turn)

    async def _commit(self, event: ev.InputAudioCommit) -> None:
        if self.audio_input.duration_ms < _MIN_COMMIT_MS:
            self.error("input_audio_buffer_commit_empty",
                       f"buffer too small: {self.audio_input.duration_ms} ms of audio, at least {_MIN_COMMIT_MS} ms "
                       "needed", event_id=event.event_id)
            return
        await self.responses.drop_early()
        samples, item_id = self.audio_input.take_all()
        self.items.commit_audio(samples, item_id, event.event_id, self._frame())

    async def _clear(self, event: ev.InputAudioClear) -> None:
        await self.responses.drop_early()
        self.audio_input.clear()
        self.sender.event(ev.InputAudioCleared())

    def _idle_timeout(self) -> None:
        """The user stayed silent after a reply: what the buffer holds is committed, and a reply asked for."""
        if self.response is not None or self.config.turn_detection is None:
            return
        start_ms, end_ms = self.audio_input.span_ms
        samples, item_id = self.audio_input.take_all()
        self.sender.event(ev.InputAudioTimeoutTriggered(audio_start_ms=start_ms, audio_end_ms=end_ms, item_id=item_id))
        log.info("session %s: idle timeout, asking for a reply", self.id)
        self.items.commit_audio(samples, item_id, frame=self._frame())
        self._start_response(self.config, ResponseContext(), None)

    def _frame(self) -> np.ndarray | None:
        if self.camera is None or not self.conversation.max_image_pixels:
            return None
        return self.camera()

    def _arm_idle_timeout(self, response: Response) -> None:
        """After a reply, once its audio has played out (as far as the server can tell) and the timeout passed."""
        td = self.config.turn_detection
        if td is None or td.type != "server_vad" or td.idle_timeout_ms is None:
            return
        played_s = time.perf_counter() - (response.first_audio_at or time.perf_counter())
        playback_left_s = max(0.0, response.item.audio_ms / 1000 - played_s)
        self.idle.arm(playback_left_s + td.idle_timeout_ms / 1000, self._idle_timeout)

    # -- responses
    async def _response_create(self, event: ev.ResponseCreate) -> None:
        request = await read_response_create(event, self.config, self.checks, self.reader, self.conversation)
        if request is None:
            return
        if self.response is None:
            self._start_response(request.config, request.context, None, request.metadata)
            return
        why = "Wait until the response is finished before creating a new one."
        if not request.context.in_conversation:
            if (refusal := self.responses.aside_refusal(request.config)) is None:
                self.responses.start_aside(request.config, request.context, request.metadata)
                return
            why = f"An out-of-band response may run beside it, but {refusal}."
        self.error("conversation_already_has_active_response",
                   f"Conversation already has an active response in progress: {self.response.id}. {why}",
                   event_id=event.event_id)

    def _start_response(self, config: ev.SessionConfig, context: ResponseContext, speech_stopped_at: float | None,
                        metadata: dict[str, str] | None = None, turn: TurnClock | None = None) -> None:
        self.idle.disarm()
        self.responses.start(config, context, speech_stopped_at, metadata, self._arm_idle_timeout, turn)

    async def _response_cancel(self, event: ev.ResponseCancel) -> None:
        response = self.responses.find(event.response_id) if event.response_id else self.response
        if response is None:
            self.error("response_cancel_not_active", CANCEL_NOT_ACTIVE, event_id=event.event_id)
            return
        await self.responses.cancel("client_cancelled", response)

    async def _output_clear(self, event: ev.OutputAudioBufferClear) -> None:
        if self.track is None:
            self.error("invalid_request", "output_audio_buffer.clear is for WebRTC sessions: this one sends audio "
                       "as events", event_id=event.event_id)
            return
        playing = self.audio_out.playing
        if self.response is not None:
            await self.cancel_response("client_cancelled")  # clears the track too
        elif playing is not None:
            self.audio_out.clear_playback(playing)

    async def cancel_response(self, reason: CancelReason) -> None:
        await self.responses.cancel(reason)


# Unbound, at module level: bound methods kept in an instance dict would make a Session <-> handler cycle,
# and only the cyclic GC would free a closed session's audio.
_HANDLERS: dict[type, Callable[[Session, Any], Awaitable[None]]] = {
    ev.SessionUpdate: Session._session_update,
    ev.InputAudioAppend: Session._append,
    ev.InputAudioCommit: Session._commit,
    ev.InputAudioClear: Session._clear,
    ev.ConversationItemCreate: lambda s, e: item_events.create(s.reader, s.items, e),
    ev.ConversationItemDelete: lambda s, e: item_events.delete(s.items, e),
    ev.ConversationItemRetrieve: lambda s, e: item_events.retrieve(s.items, e),
    ev.ConversationItemTruncate: lambda s, e: item_events.truncate(s.items, e),
    ev.ResponseCreate: Session._response_create,
    ev.ResponseCancel: Session._response_cancel,
    ev.OutputAudioBufferClear: Session._output_clear,
}
