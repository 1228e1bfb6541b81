"""One realtime response: runs the engine request and streams its transcript and audio as events.

Audio goes to the response's `AudioSink`, which the session's `AudioOut` chose for its output format. A
cancelled response stops at once: the `ResponseSlot` aborts the engine request and drops its queued audio. A
response whose audio the outbox refuses (`Delivery.SLOW_CONSUMER`) stops there too, failed, and its outcome
carries that verdict for the `ResponseSlot`. With tools in the prompt, the reply's text goes through
`ResponseCalls` (calls.py), which makes each call an output item of its own; the reply's message is announced
only once it has words or audio, so a reply of calls alone (`tool_choice: "required"`) is calls alone."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from engine import (
    OVERLOADED,
    SAMPLE_RATE_HZ,
    UNAVAILABLE,
    AudioChunk,
    Engine,
    EngineError,
    EngineRequest,
    Failed,
    Finished,
    FirstPacketParts,
    Message,
    RequestStream,
    SamplingParams,
    TextDelta,
    Timings,
)
from voice_gateway.realtime.audio_sinks import AudioSink
from voice_gateway.realtime.calls import ResponseCalls
from voice_gateway.realtime.conversation import Item
from voice_gateway.realtime.events import (
    ContentPart,
    ContentPartAdded,
    ContentPartDone,
    ConversationItemAdded,
    ConversationItemDone,
    ErrorDetail,
    FirstPacketPartsMs,
    FunctionCallItem,
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
    ResponseTiming,
    ServerEvent,
    SessionConfig,
    StatusDetails,
    Usage,
)
from voice_gateway.realtime.item_shapes import protocol_item
from voice_gateway.realtime.outbox import Delivery
from voice_gateway.realtime.sender import EventSender
from voice_gateway.realtime.tools import engine_tools, output_constraint

log = logging.getLogger(__name__)

Status = Literal["completed", "cancelled", "failed"]
CancelReason = Literal["turn_detected", "client_cancelled"]


@dataclass(slots=True)
class ResponseOutcome:
    status: Status = "completed"
    reason: CancelReason | None = None
    error: ErrorDetail | None = None
    delivery: Delivery = Delivery.QUEUED  # SLOW_CONSUMER: the outbox refused its audio, which failed it


def slow_consumer_outcome() -> ResponseOutcome:
    """A response failed because its client did not read fast enough; `error` is what response.done says."""
    error = ErrorDetail(type="server_error", code=Delivery.SLOW_CONSUMER.value,
                        message="the client did not read fast enough")
    return ResponseOutcome("failed", None, error, Delivery.SLOW_CONSUMER)


@dataclass(frozen=True, slots=True)
class TurnClock:
    """A turn that turn detection ended, on perf_counter: its speech's end, its decision and its words heard (the
    hearing's start and end, None where the engine hears audio itself)."""

    speech_end_at: float
    decided_at: float
    heard: tuple[float, float] | None = None


@dataclass(slots=True)
class Response:
    """A response's state; the session's `ResponseSlot` owns it and may cancel it."""

    id: str
    item: Item  # its message (announced once it has words, when tools are in the prompt)
    config: SessionConfig
    sink: AudioSink  # where its audio goes: the session's `AudioOut` sink for config.output_audio_format
    speech_stopped_at: float | None = None  # perf_counter of the VAD stop that triggered it
    speaker: str | None = None  # config.voice as the engine names it (None: its default)
    metadata: dict[str, str] | None = None  # response.create's, echoed in response.created and response.done
    first_audio_at: float | None = None
    turn: TurnClock | None = None  # the turn it answers, as turn detection ended it
    reply_started_at: float | None = None  # perf_counter of its engine request (its head start's, if adopted)
    asked_at: float = field(default_factory=time.perf_counter)  # when the session made it: its asking
    timings: Timings | None = None  # the engine's own, once its request finished
    outcome: ResponseOutcome = field(default_factory=ResponseOutcome)
    task: asyncio.Task | None = None
    announced: bool = False  # response.created went out
    output: list[Item] = field(default_factory=list)  # its announced output items, by output_index

    @staticmethod
    def new(item: Item, config: SessionConfig, sink: AudioSink, speech_stopped_at: float | None,
            speaker: str | None = None, metadata: dict[str, str] | None = None,
            response_id: str | None = None) -> Response:
        return Response(response_id or new_response_id(), item, config, sink, speech_stopped_at, speaker, metadata)


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex[:20]}"


def response_timing(r: Response) -> ResponseTiming | None:
    """`response.timing` for `r`, once it is done; None if it sent no audio. Its times count from the end of the
    user's speech for a response to a turn (`r.turn`), else from the response's asking."""
    if r.first_audio_at is None or r.reply_started_at is None:
        return None
    turn, t = r.turn, r.timings
    start_at = r.asked_at if turn is None else turn.speech_end_at

    def ms(at: float) -> int:
        return round(1000 * (at - start_at))

    turn_ms = heard_ms = ears_ms = None
    if turn is not None:
        turn_ms = ms(turn.decided_at)
        if turn.heard is not None:
            heard_ms, ears_ms = ms(turn.heard[1]), round(1000 * (turn.heard[1] - turn.heard[0]))
    first_token = None if t is None or t.ttft_s is None else ms(r.reply_started_at + t.ttft_s)
    engine_ms = None if t is None or t.ttfp_s is None else round(1000 * t.ttfp_s)
    parts = None if t is None or t.first_packet is None else _parts_ms(t.first_packet)
    return ResponseTiming(response_id=r.id, turn_ms=turn_ms, heard_ms=heard_ms, ears_ms=ears_ms,
                          reply_started_ms=ms(r.reply_started_at), first_token_ms=first_token,
                          first_audio_ms=ms(r.first_audio_at), engine_first_packet_ms=engine_ms,
                          first_packet_parts_ms=parts)


def _parts_ms(p: FirstPacketParts) -> FirstPacketPartsMs:
    # each part is rounded where it ends, not alone, so that the parts add up to the rounded whole
    parts_s = (p.queued_s, p.thinker_s, p.talker_prefill_s, p.talker_frames_s, p.code2wav_s)
    ends_ms = [round(1000 * end) for end in itertools.accumulate(parts_s)]
    queued, thinker, talker_prefill, talker_frames, code2wav = (b - a for a, b in itertools.pairwise([0, *ends_ms]))
    return FirstPacketPartsMs(queued_ms=queued, thinker_ms=thinker, talker_prefill_ms=talker_prefill,
                              talker_frames_ms=talker_frames, code2wav_ms=code2wav)


class ResponseRunner:
    """Streams one response: events through `sender`, audio into the response's sink. `add_item` puts an output item at
    the conversation's end and returns the id before it (an out-of-band response's adds nothing: out_of_band.py)."""

    def __init__(self, engine: Engine, response: Response, sender: EventSender,
                 add_item: Callable[[Item], str | None], head_start: RequestStream | None = None) -> None:
        """`head_start`: the engine's stream of this very reply, asked for before the turn was sure to end."""
        self.engine = engine
        self.head_start = head_start
        self.r = response
        self.sender = sender
        self.add_item = add_item
        self.audio_mode = response.config.output_modality == "audio"
        self.tools = engine_tools(response.config)
        self.calls = ResponseCalls(response.id, sender, self._announce, self._say) if self.tools else None
        self.message_index: int | None = None  # the message's output_index, once announced
        self._held_space = ""  # with tools: whitespace before the message has words
        self.transcript = ""
        self.audio_samples = 0

    def _content(self, event_cls: Callable[..., ServerEvent], **fields: Any) -> ServerEvent:
        return event_cls(response_id=self.r.id, item_id=self.r.item.id, output_index=self.message_index, **fields)

    def _announce(self, item: Item, shown: MessageItem | FunctionCallItem) -> int:
        index = len(self.r.output)
        self.r.output.append(item)
        previous = self.add_item(item)
        self.sender.event(OutputItemAdded(response_id=self.r.id, output_index=index, item=shown))
        self.sender.event(ConversationItemAdded(item=shown, previous_item_id=previous))
        return index

    def _open_message(self) -> None:
        if self.message_index is not None:
            return
        item = self.r.item
        self.message_index = self._announce(item, MessageItem(id=item.id, role="assistant", status="in_progress"))
        part = OutputPart(type="audio", transcript="") if self.audio_mode else OutputPart(type="text", text="")
        self.sender.event(self._content(ContentPartAdded, part=part))

    def _say(self, text: str) -> None:
        if self.message_index is None and self.calls is not None:
            # the whitespace a model writes before its calls is no message
            self._held_space += text
            if not self._held_space.strip():
                return
            text, self._held_space = self._held_space, ""
        self._open_message()
        self.transcript += text
        delta_cls = OutputAudioTranscriptDelta if self.audio_mode else OutputTextDelta
        self.sender.event(self._content(delta_cls, delta=text))

    async def run(self, messages: tuple[Message, ...], refusal: EngineError | None = None) -> None:
        """Stream the reply to `messages`; `refusal`: why no prompt could be made, which fails the response."""
        r = self.r
        self.sender.event(ResponseCreated(response=RealtimeResponse(id=r.id, metadata=r.metadata)))
        r.announced = True
        if self.calls is None:
            self._open_message()  # without tools every reply is a message: it is announced at once
        usage = Usage()
        try:
            if refusal is not None:
                raise refusal
            usage = await self._stream(messages)
        except asyncio.CancelledError:
            r.outcome.status = "cancelled"
        except EngineError as e:
            kind = "server_error" if e.code in (OVERLOADED, UNAVAILABLE) else "invalid_request_error"
            r.outcome = ResponseOutcome("failed", None, ErrorDetail(type=kind, code=e.code or "invalid_request",
                                                                    message=str(e)))
        except Exception as e:  # a bug of ours must still end the response, or its client waits for ever
            log.exception("response %s failed", r.id)
            r.outcome = ResponseOutcome("failed", None, ErrorDetail(type="server_error", code="internal_error",
                                                                    message=f"internal error: {type(e).__name__}"))
        self._finish(usage)

    async def _stream(self, messages: tuple[Message, ...]) -> Usage:
        if self.head_start is None:
            self.r.reply_started_at = time.perf_counter()
        stream = self.head_start or await self.engine.submit(reply_request(self.r.id, messages, self.r.config,
                                                                          self.r.speaker))
        sink, usage = self.r.sink, Usage()
        if self.audio_mode:
            sink.begin(self.r.id, self.r.item.id)
        try:
            async for event in stream:
                if isinstance(event, TextDelta):
                    if self.calls is not None:
                        self.calls.feed(event.text)
                    else:
                        self._say(event.text)
                elif isinstance(event, AudioChunk):
                    if self._audio(event.samples) is Delivery.SLOW_CONSUMER:
                        self.r.outcome = slow_consumer_outcome()
                        return Usage()
                elif isinstance(event, Finished):
                    usage = _usage(event.timings)
                    self.r.timings = event.timings
                    if self.calls is not None:
                        self.calls.close()
                    break
                elif isinstance(event, Failed):
                    self.r.outcome = ResponseOutcome("failed", None, ErrorDetail(
                        type="server_error", code=event.code or "engine_failed", message=event.reason))
            # a failed reply's audio plays out too
            if self.audio_mode and sink.finish() is Delivery.SLOW_CONSUMER:
                self.r.outcome = slow_consumer_outcome()
                return Usage()
            return usage
        finally:
            await stream.aclose()

    def _audio(self, samples: np.ndarray) -> Delivery:
        self._open_message()
        if self.r.first_audio_at is None:
            self.r.first_audio_at = time.perf_counter()
        self.audio_samples += samples.size
        return self.r.sink.write(samples)

    def _finish(self, usage: Usage) -> None:
        r, outcome = self.r, self.r.outcome
        if self.calls is not None:
            self.calls.abandon()  # a completed reply has none left open
        if self.message_index is not None:
            self._finish_message()
        details = None
        if outcome.status != "completed":
            details = StatusDetails(type=outcome.status, reason=outcome.reason, error=outcome.error)
        output = [self._final_message() if it is r.item else protocol_item(it) for it in r.output]
        done = RealtimeResponse(id=r.id, status=outcome.status, status_details=details, output=output, usage=usage,
                                metadata=r.metadata)
        self.sender.event(ResponseDone(response=done))
        log.info("response %s %s (%s): %d ms of audio, %d output items", r.id, outcome.status, outcome.reason or "-",
                 r.item.audio_ms, len(output))

    def _final_message(self) -> MessageItem:
        item = self.r.item
        if self.audio_mode:
            content = [ContentPart(type="output_audio", transcript=self.transcript)]
        else:
            content = [ContentPart(type="output_text", text=self.transcript)]
        return MessageItem(id=item.id, role="assistant", status=item.status, content=content)

    def _finish_message(self) -> None:
        r, item, outcome = self.r, self.r.item, self.r.outcome
        item.text = self.transcript
        item.audio_ms = self.audio_samples * 1000 // SAMPLE_RATE_HZ
        item.status = "completed" if outcome.status == "completed" else "incomplete"
        final_item = self._final_message()
        if outcome.status == "completed":
            if self.audio_mode:
                self.sender.event(self._content(OutputAudioDone))
                self.sender.event(self._content(OutputAudioTranscriptDone, transcript=self.transcript))
                part = OutputPart(type="audio", transcript=self.transcript)
            else:
                self.sender.event(self._content(OutputTextDone, text=self.transcript))
                part = OutputPart(type="text", text=self.transcript)
            self.sender.event(self._content(ContentPartDone, part=part))
        self.sender.event(OutputItemDone(response_id=r.id, output_index=self.message_index or 0, item=final_item))
        self.sender.event(ConversationItemDone(item=final_item))


def reply_request(request_id: str, messages: tuple[Message, ...], cfg: SessionConfig,
                  speaker: str | None) -> EngineRequest:
    """The engine request of a response in session settings `cfg`: one place, so a reply started early is the same.
    Every response of a session is a live turn, out-of-band ones too: a failed response carries no Retry-After, and
    the session's client (a caller on the line, or the app that runs the call) waits for it before going on."""
    max_tokens = None if cfg.max_output_tokens == "inf" else cfg.max_output_tokens
    return EngineRequest(
        request_id=request_id,
        messages=messages,
        want_audio=cfg.output_modality == "audio",
        speaker=speaker,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=cfg.temperature),
        tools=engine_tools(cfg),
        output=output_constraint(cfg),
        conversation=cfg.id,  # the session's
        live_turn=True,
    )


def _usage(t: Timings) -> Usage:
    return Usage(
        total_tokens=t.prompt_tokens + t.completion_tokens + t.codec_frames,
        input_tokens=t.prompt_tokens,
        output_tokens=t.completion_tokens + t.codec_frames,
        input_token_details=InputTokenDetails(
            text_tokens=t.prompt_tokens - t.prompt_audio_tokens - t.prompt_image_tokens,
            audio_tokens=t.prompt_audio_tokens, image_tokens=t.prompt_image_tokens, cached_tokens=t.cached_tokens,
        ),
        output_token_details=OutputTokenDetails(text_tokens=t.completion_tokens, audio_tokens=t.codec_frames),
    )
