"""Admitted requests across a backend's stages; owns the per-request records.

Stages run in their own threads and report here through the event loop (`ReportQueue`); each
request's events leave through its sink, and `Finished` goes out once the Thinker is done and
(for audio) Code2Wav has sent the last chunk. A stage whose loop has not come round for `stall_after_s` has hung:
the engine is then down, and its threads' stacks go to the log once, which is what finds the hang.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.api import (
    SAMPLE_RATE_HZ,
    AudioChunk,
    EngineError,
    EngineHealth,
    Failed,
    Finished,
    FirstPacketParts,
    OutputEvent,
    TextDelta,
    Timings,
)
from engine.core import Pools, Sink
from engine.handoff import (
    Abort,
    AdmittedRequest,
    AudioFinished,
    Inbox,
    Milestone,
    Reached,
    ReportQueue,
    StageFailed,
    StickyRouter,
    ThinkerFinished,
)
from engine.metrics import EngineMetrics
from engine.stage import Stage

log = logging.getLogger(__name__)

# Longer than any one step: the longest are the first of a shape compiled after start-up (tens of seconds on a GPU).
STALL_AFTER_S = 120.0


@dataclass(slots=True)
class RequestRecord:
    request: AdmittedRequest
    sink: Sink
    submitted_at: float
    first_text_at: float | None = None
    first_audio_at: float | None = None
    last_audio_at: float | None = None
    audio_samples: int = 0
    thinker: ThinkerFinished | None = None
    audio: AudioFinished | None = None
    done: bool = False
    reached: dict[Milestone, float] = field(default_factory=dict)
    first_packet: FirstPacketParts | None = None


class Orchestrator:
    """`thinker_inbox`: where admitted requests go; `stages`: every stage by name, started and stopped here; `speaks`:
    whether a stage after the Thinker speaks; `routers`: in front of stages with copies (an abort must reach them);
    `capacity`: the memory plan's line, and `pools` what it gave the KV pools, where there is one (the gate counts
    each reply's room in them)."""

    def __init__(
        self,
        *,
        thinker_inbox: Inbox,
        stages: dict[str, Stage],
        reports: ReportQueue,
        metrics: EngineMetrics,
        speaks: bool,
        routers: tuple[StickyRouter, ...] = (),
        capacity: str = "",
        pools: Pools | None = None,
        stall_after_s: float = STALL_AFTER_S,
    ) -> None:
        self.thinker_inbox = thinker_inbox
        self.stages = stages
        self.reports = reports
        self.metrics = metrics
        self.registry = metrics.registry
        self.speaks = speaks
        self.routers = routers
        self.serving = EngineHealth("ok", capacity=capacity)
        self.stall_after_s = stall_after_s
        self._stall_logged = False
        self.pools = pools
        self.records: dict[str, RequestRecord] = {}

    # -- lifecycle
    async def start(self) -> None:
        self.reports.bind(asyncio.get_running_loop(), self._on_report)
        for stage in self.stages.values():
            stage.start()
        self.metrics.cold_work.arm()  # everything start-up compiles, captures and warms is behind us

    async def stop(self) -> None:
        self.metrics.cold_work.disarm()
        for stage in self.stages.values():
            await asyncio.to_thread(stage.stop)
        for record in list(self.records.values()):
            self._close(record, Failed(record.request.request_id, "server shutting down"))

    def stage_load(self) -> dict[str, int]:
        return {name: s.num_running() + s.num_waiting() for name, s in self.stages.items()}

    def health(self) -> EngineHealth:
        stuck_s, name = max(((s.stuck_s(), s.name) for s in self.stages.values()), default=(0.0, ""))
        if stuck_s <= self.stall_after_s:
            self._stall_logged = False
            return self.serving
        detail = f"the {name} stage has hung: one step has not returned for {stuck_s:.0f} s"
        if not self._stall_logged:
            self._stall_logged = True
            log.error("%s; every thread's stack follows", detail)
            faulthandler.dump_traceback(all_threads=True)
        return EngineHealth("down", detail, capacity=self.serving.capacity)

    # -- requests
    def begin(self, request: AdmittedRequest, sink: Sink) -> None:
        rid = request.request_id
        if rid in self.records:
            raise EngineError(f"request id {rid} is already in use")
        if (health := self.health()).status == "down":
            raise health.refusal()
        if request.want_audio and not self.speaks:
            raise EngineError("this model has no talker: ask for text only")
        self.records[rid] = RequestRecord(request, sink, time.perf_counter())
        self.metrics.active.set(len(self.records))
        self.thinker_inbox.put(request)
        log.info("request %s submitted: %d prompt tokens, audio=%s", rid, len(request.token_ids), request.want_audio)

    def abort(self, request_id: str) -> None:
        record = self.records.get(request_id)
        self._abort_everywhere(request_id)
        if record is not None:
            log.info("request %s aborted", request_id)
            self.metrics.requests.labels("aborted").inc()
            self._close(record, Failed(request_id, "aborted"))

    def _abort_everywhere(self, request_id: str) -> None:
        for stage in self.stages.values():
            stage.inbox.put(Abort(request_id))
        for router in self.routers:
            router.forget(request_id)

    # -- stage reports, on the event loop
    def _on_report(self, item: Any) -> None:
        record = self.records.get(item.request_id)
        if record is None:  # aborted or failed already
            return
        try:
            self._apply_report(record, item)
        except Exception as e:  # a bug here must fail one request, not leave its client waiting forever
            log.exception("request %s: could not handle %s", item.request_id, type(item).__name__)
            self._close(record, Failed(item.request_id, f"internal error: {type(e).__name__}: {e}"))
            self._abort_everywhere(item.request_id)

    def _apply_report(self, record: RequestRecord, item: Any) -> None:
        now = time.perf_counter()
        if isinstance(item, TextDelta):
            if record.first_text_at is None:
                record.first_text_at = now
                self.metrics.ttft.observe(now - record.submitted_at)
            record.sink(item)
        elif isinstance(item, AudioChunk):
            if item.samples.size:
                if record.first_audio_at is None:
                    record.first_audio_at = now
                    self.metrics.ttfp.observe(now - record.submitted_at)
                    record.first_packet = _parts(record.submitted_at, record.reached, now)
                    for part, seconds in asdict(record.first_packet).items():
                        self.metrics.first_packet.labels(part.removesuffix("_s")).observe(seconds)
                elif record.last_audio_at is not None:
                    self.metrics.chunk_gap.observe(now - record.last_audio_at)
                record.last_audio_at = now
                record.audio_samples += item.samples.size
                record.sink(item)
        elif isinstance(item, ThinkerFinished):
            record.thinker = item
            self.metrics.prompt_tokens.labels("prefilled").inc(item.prompt_tokens - item.cached_tokens)
            self.metrics.prompt_tokens.labels("cached").inc(item.cached_tokens)
        elif isinstance(item, Reached):
            record.reached[item.milestone] = item.at
        elif isinstance(item, AudioFinished):
            record.audio = item
        elif isinstance(item, StageFailed):
            log.error("request %s failed: %s", item.request_id, item.reason)
            self.metrics.requests.labels("failed").inc()
            self._abort_everywhere(item.request_id)
            self._close(record, Failed(item.request_id, item.reason))
            return
        if record.thinker is not None and (record.audio is not None or not record.request.want_audio):
            self._finish(record, now)

    def _finish(self, record: RequestRecord, now: float) -> None:
        assert record.thinker is not None
        t0 = record.submitted_at
        timings = Timings(
            ttft_s=None if record.first_text_at is None else record.first_text_at - t0,
            ttfp_s=None if record.first_audio_at is None else record.first_audio_at - t0,
            total_s=now - t0,
            prompt_tokens=len(record.request.token_ids),
            prompt_audio_tokens=record.request.audio_tokens,
            prompt_image_tokens=record.request.image_tokens,
            completion_tokens=record.thinker.completion_tokens,
            codec_frames=record.audio.codec_frames if record.audio else 0,
            audio_samples=record.audio_samples,
            cached_tokens=record.thinker.cached_tokens,
            first_packet=record.first_packet,
        )
        if record.audio_samples and record.last_audio_at is not None:
            self.metrics.rtf.observe((record.last_audio_at - t0) / (record.audio_samples / SAMPLE_RATE_HZ))
        self.metrics.requests.labels("completed").inc()
        log.info(
            "request %s finished (%s): %d prompt tokens (%d cached), %d tokens, %d frames, ttfp=%s total=%.3fs",
            record.request.request_id,
            record.thinker.finish_reason,
            timings.prompt_tokens,
            timings.cached_tokens,
            timings.completion_tokens,
            timings.codec_frames,
            f"{timings.ttfp_s:.3f}s" if timings.ttfp_s is not None else "-",
            timings.total_s,
        )
        self._close(record, Finished(record.request.request_id, record.thinker.finish_reason, timings))

    def _close(self, record: RequestRecord, event: OutputEvent) -> None:
        if record.done:
            return
        record.done = True
        self.records.pop(record.request.request_id, None)
        self.metrics.active.set(len(self.records))
        record.sink(event)


def _parts(submitted_at: float, reached: dict[Milestone, float], first_audio_at: float) -> FirstPacketParts:
    """The first packet split at the milestones its stages reported: each part runs from the later of the milestones
    before it, so none is negative and they add up to submit -> first packet. A milestone not reported (a stage
    that failed to say) gives its part 0."""
    ends, at = [], submitted_at
    for milestone in ("thinker", "first_token", "talker", "code2wav"):
        at = min(max(at, reached.get(milestone, at)), first_audio_at)
        ends.append(at)
    ends.append(first_audio_at)
    starts = [submitted_at, *ends[:-1]]
    queued, thinker, talker_prefill, talker_frames, code2wav = (end - start for start, end in zip(starts, ends, strict=True))
    return FirstPacketParts(queued, thinker, talker_prefill, talker_frames, code2wav)
