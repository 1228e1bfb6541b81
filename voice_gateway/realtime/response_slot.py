"""A session's responses in flight: starting them, cancelling them (barge-in, `response.cancel`, close), and what
their end means to the session. One response at a time is `current` (the one a barge-in cuts off); out-of-band
responses may run beside it, each with its own sink where event audio allows. Opus packets and a WebRTC track
carry one reply's audio at a time, so there a second response must answer in text."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from engine import Engine, EngineError, Message
from voice_gateway.metrics import GatewayMetrics
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.audio_out import AudioOut
from voice_gateway.realtime.audio_sinks import AudioSink, event_sink
from voice_gateway.realtime.conversation import ContextFull, Item, new_item_id
from voice_gateway.realtime.conversation_items import ConversationItems
from voice_gateway.realtime.head_start import HeadStart
from voice_gateway.realtime.out_of_band import ResponseContext
from voice_gateway.realtime.outbox import Delivery
from voice_gateway.realtime.reporter import ErrorReporter
from voice_gateway.realtime.response import (
    CancelReason,
    Response,
    ResponseRunner,
    TurnClock,
    new_response_id,
    reply_request,
    response_timing,
)
from voice_gateway.realtime.sender import EventSender
from voice_gateway.voices import UnknownVoice, resolve_voice

log = logging.getLogger(__name__)

OnCompleted = Callable[[Response], None]


def _unheard(response: Response) -> None:
    """An out-of-band response beside another: its end arms nothing (the idle timeout follows the current one)."""


class ResponseSlot:
    """Owns the session's one active response (`current`, None between responses) and its task, and the reply started
    on a probable end of the user's turn (`head_start`), which the next response adopts if its prompt is the same."""

    def __init__(self, engine: Engine, items: ConversationItems, audio_out: AudioOut, sender: EventSender,
                 reporter: ErrorReporter, metrics: GatewayMetrics, session_id: str, timing: bool = False) -> None:
        """`timing`: each spoken response ends with our `response.timing` event (the client asked for it)."""
        self.engine = engine
        self.items = items
        self.audio_out = audio_out
        self.sender = sender
        self.reporter = reporter
        self.metrics = metrics
        self.session_id = session_id
        self.timing = timing
        self.current: Response | None = None
        self.aside: dict[str, Response] = {}  # out-of-band responses running beside `current`, by id
        self.head_start: HeadStart | None = None
        self._closing: set[asyncio.Task] = set()  # early replies not adopted, being aborted

    async def start_early(self, config: ev.SessionConfig, messages: tuple[Message, ...]) -> None:
        """The engine starts on the reply to `messages` now; nothing reaches the client until a response adopts it."""
        await self.drop_early()
        response_id = new_response_id()
        try:
            stream = await self.engine.submit(reply_request(response_id, messages, config, self._speaker(config)))
        except EngineError as e:  # the turn's own response will meet the same refusal, and say it
            log.info("session %s: no early start (%s)", self.session_id, e.code)
            return
        self.head_start = HeadStart(response_id, stream, messages)
        log.info("session %s: reply %s started on a probable end of turn", self.session_id, response_id)

    async def drop_early(self) -> None:
        """The speaker went on (or the session changed): the early reply's engine work is aborted, unseen."""
        head, self.head_start = self.head_start, None
        if head is not None:
            await head.stream.aclose()
            log.info("session %s: reply %s started early dropped after %.0f ms", self.session_id, head.response_id,
                     1000 * (time.perf_counter() - head.started_at))

    def start(self, config: ev.SessionConfig, context: ResponseContext, speech_stopped_at: float | None,
              metadata: dict[str, str] | None, on_completed: OnCompleted, turn: TurnClock | None = None) -> None:
        """Run a response now (none may be active); `on_completed` hears if it completes with none after it, and lives
        only as long as the response's task, so a closed session is no cycle's hostage."""
        assert self.current is None, f"response {self.current.id} is still active"
        head, self.head_start = self.head_start, None
        self.current = self._launch(config, context, speech_stopped_at, metadata, on_completed,
                                    self.audio_out.sink_for(config.output_audio_format), head)
        self.current.turn = turn

    def aside_refusal(self, config: ev.SessionConfig) -> str | None:
        """Why an out-of-band response cannot run beside the current one now, or None."""
        if config.output_modality == "audio" and (self.audio_out.track is not None
                                                   or config.output_audio_format is ev.AudioFormat.OPUS):
            return ("a response is in progress, and an out-of-band response beside it must answer in text, or in "
                    "pcm16 or g711 audio over a WebSocket: Opus packets and a WebRTC track carry one reply at a time")
        return None

    def start_aside(self, config: ev.SessionConfig, context: ResponseContext, metadata: dict[str, str] | None) -> None:
        assert not context.in_conversation and self.aside_refusal(config) is None
        sink = event_sink(config.output_audio_format, self.sender, self.audio_out.opus_bitrate_bps)
        response = self._launch(config, context, None, metadata, _unheard, sink)
        self.aside[response.id] = response

    def _launch(self, config: ev.SessionConfig, context: ResponseContext, speech_stopped_at: float | None,
                metadata: dict[str, str] | None, on_completed: OnCompleted, sink: AudioSink,
                head: HeadStart | None = None) -> Response:
        item = Item(new_item_id(), "assistant", status="in_progress")
        refusal: ContextFull | None = None
        try:
            messages = self.items.prompt(context, config)
        except ContextFull as e:
            messages, refusal = (), e
            log.warning("session %s: response refused: %s", self.session_id, e)
        if head is not None and (refusal is not None or not head.serves(messages)):
            closing = asyncio.get_running_loop().create_task(head.stream.aclose())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
            log.info("session %s: reply %s started early is not this turn's: dropped", self.session_id,
                     head.response_id)
            head = None
        response = Response.new(item, config, sink, speech_stopped_at, self._speaker(config), metadata,
                                head.response_id if head is not None else None)
        if head is not None:
            response.reply_started_at = head.started_at
        runner = ResponseRunner(self.engine, response, *context.output_to(self.items.conversation, self.sender),
                                head.stream if head is not None else None)
        response.task = asyncio.create_task(self._run(runner, messages, refusal, on_completed))
        return response

    async def _run(self, runner: ResponseRunner, messages: tuple[Message, ...], refusal: ContextFull | None,
                   on_completed: OnCompleted) -> None:
        response = runner.r
        try:
            await runner.run(messages, refusal)
        finally:
            if self.current is response:
                self.current = None
            self.aside.pop(response.id, None)
            if response.outcome.delivery is Delivery.SLOW_CONSUMER:
                response.sink.cancel()
                self.reporter.error(Delivery.SLOW_CONSUMER.value,
                                    f"response {response.id} cancelled: the client did not read fast enough")
            if self.timing and response.outcome.status == "completed" \
                    and (timing := response_timing(response)) is not None:
                self.sender.event(timing)
            if response.outcome.status != "completed":
                self.metrics.cancelled_responses.labels(response.outcome.reason or response.outcome.status).inc()
            else:
                if response.speech_stopped_at is not None and response.first_audio_at is not None:
                    self.metrics.turn_latency.observe(response.first_audio_at - response.speech_stopped_at)
                if self.current is None:
                    on_completed(response)

    def _speaker(self, config: ev.SessionConfig) -> str | None:
        # voices were checked when set: an engine that lost the speaker since answers the request itself
        speaker = config.voice
        if speaker is not None:
            with contextlib.suppress(UnknownVoice):
                speaker = resolve_voice(speaker, self.engine.info.speakers)
        return speaker

    def find(self, response_id: str) -> Response | None:
        if self.current is not None and self.current.id == response_id:
            return self.current
        return self.aside.get(response_id)

    async def cancel_all(self, reason: CancelReason) -> None:
        await self.drop_early()
        for response in [*self.aside.values(), self.current]:
            if response is not None:
                await self.cancel(reason, response)

    async def cancel(self, reason: CancelReason, response: Response | None = None) -> None:
        """Stop a response now (the current one unless named): no more of its audio leaves, the engine frees it."""
        response = response or self.current
        if response is None or response.task is None:
            return
        if not response.announced:
            # a task cancelled before its first step never runs a line, so its client, who asked for it,
            # would hear neither response.created nor response.done: one turn of the loop announces it
            await asyncio.sleep(0)
        if response is self.current:
            self.current = None
        self.aside.pop(response.id, None)
        response.outcome.reason = reason
        if response.sink is self.audio_out.track:
            dropped = 0
            self.audio_out.clear_playback(response.id)
        else:
            dropped = response.sink.cancel()
        response.task.cancel()
        await asyncio.gather(response.task, return_exceptions=True)
        log.info("session %s: response %s cancelled (%s), %d queued messages dropped", self.session_id, response.id,
                 reason, dropped)
