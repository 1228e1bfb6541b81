"""Request lifecycle across stages: submit, stream, abort; owns the per-request records.

Stages run in their own threads and report here through the event loop; each
request's events leave through its own queue, and `Finished` goes out once the
Thinker is done and (for audio) Code2Wav has sent the last chunk.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.admission import RequestStream, resolve_max_tokens, resolve_speaker
from engine.api import (
    SAMPLE_RATE_HZ,
    AudioChunk,
    EngineError,
    EngineRequest,
    Failed,
    Finished,
    ModelInfo,
    OutputEvent,
    TextDelta,
    Timings,
)
from engine.handoff import Abort, AudioFinished, StageFailed, StickyRouter, ThinkerFinished, ThinkerJob
from engine.metrics import EngineMetrics
from engine.profile import DeployProfile
from engine.prompt import Prompt, PromptBuilder
from engine.stages.base import Stage

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RequestRecord:
    request: EngineRequest
    queue: asyncio.Queue[OutputEvent]
    submitted_at: float
    prompt_tokens: int
    prompt_audio_tokens: int
    first_text_at: float | None = None
    first_audio_at: float | None = None
    last_audio_at: float | None = None
    audio_samples: int = 0
    thinker: ThinkerFinished | None = None
    audio: AudioFinished | None = None
    done: bool = False


class Orchestrator:
    def __init__(
        self,
        *,
        info: ModelInfo,
        profile: DeployProfile,
        prompt_builder: PromptBuilder,
        stages: dict[str, Stage],
        metrics: EngineMetrics,
        has_talker: bool,
        routers: tuple[StickyRouter, ...] = (),
    ) -> None:
        self.info = info
        self.profile = profile
        self.prompt_builder = prompt_builder
        self.stages = stages
        self.metrics = metrics
        self.registry = metrics.registry
        self.has_talker = has_talker
        self.routers = routers  # in front of stages with replicas
        self.records: dict[str, RequestRecord] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reports: deque[Any] = deque()
        self._reports_lock = threading.Lock()
        self._drain_scheduled = False
        self._prior_switch_interval: float | None = None
        # replies that want audio and have none yet: Code2Wav may hold back replies far ahead for them
        self.awaiting_first_audio: set[str] = set()
        for stage in stages.values():
            if hasattr(stage, "awaiting_first_audio"):
                stage.awaiting_first_audio = self.awaiting_first_audio

    @classmethod
    def from_model(cls, model: str, profile: DeployProfile, cache_dir: Path | None = None) -> Orchestrator:
        from engine.assemble import build_engine_parts

        return cls(**build_engine_parts(model, profile, cache_dir))

    # -- lifecycle
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if interval_ms := self.profile.stages.gil_switch_interval_ms:
            self._prior_switch_interval = sys.getswitchinterval()
            log.info("GIL switch interval %.2f ms while the engine runs (was %.2f ms)", interval_ms,
                     1000 * self._prior_switch_interval)
            sys.setswitchinterval(interval_ms / 1000)
        for stage in self.stages.values():
            stage.report = self._report_threadsafe
            stage.start()

    async def stop(self) -> None:
        for stage in self.stages.values():
            await asyncio.to_thread(stage.stop)
        for record in list(self.records.values()):
            self._close(record, Failed(record.request.request_id, "server shutting down"))
        if self._prior_switch_interval is not None:
            sys.setswitchinterval(self._prior_switch_interval)
            self._prior_switch_interval = None

    def num_active_requests(self) -> int:
        return len(self.records)

    def stage_load(self) -> dict[str, int]:
        """Requests each stage still holds (running or waiting)."""
        return {name: s.num_running() + s.num_waiting() for name, s in self.stages.items()}

    # -- requests
    async def submit(self, request: EngineRequest, prompt: Prompt | None = None) -> RequestStream:
        """`prompt`: already built from the request's messages (the engine process's parent builds them)."""
        assert self._loop is not None, "engine not started"
        rid = request.request_id
        if rid in self.records:
            raise EngineError(f"request id {rid} is already in use")
        speaker = resolve_speaker(request, self.profile, self.info.speakers if self.has_talker else ())
        cfg = self.profile.stages.thinker
        sp = request.sampling
        if prompt is None:
            # in a thread even for short text: on the loop, the tokenizer's GIL hand-back waits on the stage
            # threads, and a burst of 64 arrivals then holds back every response (H200 rung 28's first run)
            prompt = await asyncio.to_thread(self.prompt_builder.build, request.messages)
        prompt_len = len(prompt.token_ids)
        max_tokens = resolve_max_tokens(sp.max_tokens, cfg, prompt_len)
        record = RequestRecord(request, asyncio.Queue(), time.perf_counter(), prompt_len, prompt.audio_tokens)
        self.records[rid] = record
        self.metrics.active.set(len(self.records))
        if request.want_audio and self.has_talker:
            self.awaiting_first_audio.add(rid)
        self.stages["thinker"].inbox.put(
            ThinkerJob(
                request_id=rid,
                token_ids=prompt.token_ids,
                audio_features=prompt.audio_features,
                want_audio=request.want_audio,
                speaker=speaker,
                max_tokens=max_tokens,
                temperature=sp.temperature if sp.temperature is not None else cfg.sampling.temperature,
                top_p=sp.top_p if sp.top_p is not None else cfg.sampling.top_p,
                top_k=cfg.sampling.top_k,
                seed=sp.seed,
            )
        )
        log.info("request %s submitted: %d prompt tokens, audio=%s", rid, prompt_len, request.want_audio)
        return RequestStream(rid, record.queue, self.abort)

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

    # -- stage reports (stage threads -> event loop)
    def _report_threadsafe(self, item: Any) -> None:
        """Queue a report for the loop. One wake-up carries every report queued before it runs: a
        Thinker step at batch 64 makes 64 text deltas, and 64 wake-ups of a loop that shares the GIL
        with the stage threads cost every reply's first packet."""
        assert self._loop is not None
        self._reports.append(item)  # deque appends are thread-safe; one deque keeps the order
        with self._reports_lock:
            if self._drain_scheduled:
                return
            self._drain_scheduled = True
        self._loop.call_soon_threadsafe(self._drain_reports)

    def _drain_reports(self) -> None:
        with self._reports_lock:
            self._drain_scheduled = False  # before draining: a report queued from now on schedules anew
        while self._reports:
            self._on_report(self._reports.popleft())

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
            record.queue.put_nowait(item)
        elif isinstance(item, AudioChunk):
            if item.samples.size:
                if record.first_audio_at is None:
                    record.first_audio_at = now
                    self.awaiting_first_audio.discard(item.request_id)
                    self.metrics.ttfp.observe(now - record.submitted_at)
                elif record.last_audio_at is not None:
                    self.metrics.chunk_gap.observe(now - record.last_audio_at)
                record.last_audio_at = now
                record.audio_samples += item.samples.size
                record.queue.put_nowait(item)
        elif isinstance(item, ThinkerFinished):
            record.thinker = item
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
            prompt_tokens=record.prompt_tokens,
            prompt_audio_tokens=record.prompt_audio_tokens,
            completion_tokens=record.thinker.completion_tokens,
            codec_frames=record.audio.codec_frames if record.audio else 0,
            audio_samples=record.audio_samples,
        )
        if record.audio_samples and record.last_audio_at is not None:
            self.metrics.rtf.observe((record.last_audio_at - t0) / (record.audio_samples / SAMPLE_RATE_HZ))
        self.metrics.requests.labels("completed").inc()
        log.info(
            "request %s finished (%s): %d tokens, %d frames, ttfp=%s total=%.3fs",
            record.request.request_id,
            record.thinker.finish_reason,
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
        self.awaiting_first_audio.discard(record.request.request_id)
        self.metrics.active.set(len(self.records))
        record.queue.put_nowait(event)
