"""A session's response in flight: starting it, cancelling it (barge-in, `response.cancel`, close), and what its
end means to the session (a slow reader told so, the metrics counted, the caller told it completed)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from engine import Engine, Message
from voice_gateway.metrics import GatewayMetrics
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.audio_out import AudioOut
from voice_gateway.realtime.conversation import ContextFull, Item, new_item_id
from voice_gateway.realtime.conversation_items import ConversationItems
from voice_gateway.realtime.out_of_band import ResponseContext
from voice_gateway.realtime.outbox import Delivery
from voice_gateway.realtime.reporter import ErrorReporter
from voice_gateway.realtime.response import CancelReason, Response, ResponseRunner
from voice_gateway.realtime.sender import EventSender
from voice_gateway.realtime.voices import UnknownVoice, resolve_voice

log = logging.getLogger(__name__)

OnCompleted = Callable[[Response], None]


class ResponseSlot:
    """Owns the session's one active response (`current`, None between responses) and its task."""

    def __init__(self, engine: Engine, items: ConversationItems, audio_out: AudioOut, sender: EventSender,
                 reporter: ErrorReporter, metrics: GatewayMetrics, session_id: str) -> None:
        self.engine = engine
        self.items = items
        self.audio_out = audio_out
        self.sender = sender
        self.reporter = reporter
        self.metrics = metrics
        self.session_id = session_id
        self.current: Response | None = None

    def start(self, config: ev.SessionConfig, context: ResponseContext, speech_stopped_at: float | None,
              metadata: dict[str, str] | None, on_completed: OnCompleted) -> None:
        """Run a response now (none may be active); `on_completed` hears of it if it completes with none after it.

        `on_completed` lives only as long as the response's task: a closed session is no cycle's hostage.
        """
        assert self.current is None, f"response {self.current.id} is still active"
        item = Item(new_item_id(), "assistant", status="in_progress")
        refusal: ContextFull | None = None
        try:
            messages = self.items.prompt(context, config)
        except ContextFull as e:
            messages, refusal = (), e
            log.warning("session %s: response refused: %s", self.session_id, e)
        # voices were checked when set: an engine that lost the speaker since answers the request itself
        speaker = config.voice
        if speaker is not None:
            with contextlib.suppress(UnknownVoice):
                speaker = resolve_voice(speaker, self.engine.info.speakers)
        response = Response.new(item, config, self.audio_out.sink_for(config.output_audio_format), speech_stopped_at,
                                speaker, metadata)
        self.current = response
        runner = ResponseRunner(self.engine, response, *context.output_to(self.items.conversation, self.sender))
        response.task = asyncio.create_task(self._run(runner, messages, refusal, on_completed))

    async def _run(self, runner: ResponseRunner, messages: tuple[Message, ...], refusal: ContextFull | None,
                   on_completed: OnCompleted) -> None:
        response = runner.r
        try:
            await runner.run(messages, refusal)
        finally:
            if self.current is response:
                self.current = None
            if response.outcome.delivery is Delivery.SLOW_CONSUMER:
                response.sink.cancel()
                self.reporter.error(Delivery.SLOW_CONSUMER.value,
                                    f"response {response.id} cancelled: the client did not read fast enough")
            if response.outcome.status != "completed":
                self.metrics.cancelled_responses.labels(response.outcome.reason or response.outcome.status).inc()
            else:
                if response.speech_stopped_at is not None and response.first_audio_at is not None:
                    self.metrics.turn_latency.observe(response.first_audio_at - response.speech_stopped_at)
                if self.current is None:
                    on_completed(response)

    async def cancel(self, reason: CancelReason) -> None:
        """Stop the active response now: no more of its audio leaves, the engine frees it."""
        response = self.current
        if response is None or response.task is None:
            return
        if not response.announced:
            # a task cancelled before its first step never runs a line, so its client, who asked for it,
            # would hear neither response.created nor response.done: one turn of the loop announces it
            await asyncio.sleep(0)
        self.current = None
        response.outcome.reason = reason
        if self.audio_out.track is not None:
            dropped = 0
            self.audio_out.clear_playback(response.id)
        else:
            dropped = response.sink.cancel()
        response.task.cancel()
        await asyncio.gather(response.task, return_exceptions=True)
        log.info("session %s: response %s cancelled (%s), %d queued messages dropped", self.session_id, response.id,
                 reason, dropped)
