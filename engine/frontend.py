"""The `Engine` the network edge talks to: admission at the front door, the work in a core.

`Frontend` owns the open request streams. Each request is admitted here (engine/admission.py),
then begun in the core, whose events come back to the request's own queue; closing a stream
early aborts its request. The core is the staged orchestrator or the baseline in this process,
or a proxy to one in another process (engine/remote/): the front end is the same for all three.
Its health is the core's while it runs, and `down` before its start and from its stop.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from engine.admission import Admission
from engine.api import (
    AudioPart,
    EngineError,
    EngineHealth,
    EngineRequest,
    Failed,
    Finished,
    ModelInfo,
    OutputEvent,
    TextDelta,
    Timings,
)
from engine.core import EngineCore


class RequestStream:
    """Async iterator over one request's events, up to its Finished or Failed."""

    def __init__(self, request_id: str, events: asyncio.Queue[OutputEvent], abort: Callable[[str], None]) -> None:
        self.request_id = request_id
        self._events = events
        self._abort = abort
        self._ended = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> OutputEvent:
        if self._ended:
            raise StopAsyncIteration
        event = await self._events.get()
        self._ended = isinstance(event, (Finished, Failed))
        return event

    async def aclose(self) -> None:
        if not self._ended:
            self._ended = True
            self._abort(self.request_id)


class Frontend:
    """`admission`: the front door, or how to open it once the core has started (an engine process
    that other server processes started, whose model and profile this process learns from it)."""

    def __init__(self, core: EngineCore, admission: Admission | Callable[[], Admission]) -> None:
        self.core = core
        self._admission = admission if isinstance(admission, Admission) else None
        self._open_admission = None if isinstance(admission, Admission) else admission
        self._streams: dict[str, asyncio.Queue[OutputEvent]] = {}
        self._running = False

    @property
    def admission(self) -> Admission:
        assert self._admission is not None, "engine not started"
        return self._admission

    @property
    def info(self) -> ModelInfo:
        return self.admission.info

    @property
    def registry(self) -> CollectorRegistry:
        return self.core.registry

    async def start(self) -> None:
        await self.core.start()
        if self._open_admission is not None:
            self._admission = await asyncio.to_thread(self._open_admission)
        self._running = True

    async def stop(self) -> None:
        self._running = False
        await self.core.stop()
        for request_id in list(self._streams):
            self._deliver(request_id, Failed(request_id, "server shutting down"))

    async def submit(self, request: EngineRequest) -> RequestStream:
        rid = request.request_id
        if rid in self._streams:
            raise EngineError(f"request id {rid} is already in use")
        if request.task == "transcribe" and self.admission.hear is not None:
            return await self._heard(request, self.admission.hear)
        admitted = await self.admission.admit(request)
        if rid in self._streams:  # checked again: admission may have awaited
            raise EngineError(f"request id {rid} is already in use")
        events: asyncio.Queue[OutputEvent] = asyncio.Queue()
        self._streams[rid] = events
        try:
            self.core.begin(admitted, functools.partial(self._deliver, rid))
        except BaseException:
            self._streams.pop(rid, None)
            raise
        return RequestStream(rid, events, self.abort)

    async def _heard(self, request: EngineRequest, hear: Callable[[AudioPart], str]) -> RequestStream:
        """A transcription the ears give: the last message's clips, heard in a thread; no core runs."""
        rid, started = request.request_id, time.perf_counter()
        clips = [p for p in request.messages[-1].content if isinstance(p, AudioPart)] if request.messages else []
        if not clips:
            raise EngineError("a transcription needs audio in its last message")
        events: asyncio.Queue[OutputEvent] = asyncio.Queue()
        self._streams[rid] = events
        try:
            text = " ".join(filter(None, [await asyncio.to_thread(hear, clip) for clip in clips]))
        except BaseException:
            self._streams.pop(rid, None)
            raise
        took = time.perf_counter() - started
        words = len(self.admission.prompts.tokenizer.encode(text, add_special_tokens=False)) if text else 0
        if text:
            self._deliver(rid, TextDelta(rid, text, ()))
        self._deliver(rid, Finished(rid, "stop", Timings(ttft_s=took, ttfp_s=None, total_s=took, prompt_tokens=0,
                                                         prompt_audio_tokens=0, completion_tokens=words,
                                                         codec_frames=0, audio_samples=0)))
        return RequestStream(rid, events, self.abort)

    def abort(self, request_id: str) -> None:
        if request_id in self._streams:
            self.core.abort(request_id)

    def num_active_requests(self) -> int:
        return len(self._streams)

    def stage_load(self) -> dict[str, int]:
        return self.core.stage_load()

    def health(self) -> EngineHealth:
        return self.core.health() if self._running else EngineHealth("down", "the engine is not running")

    def _deliver(self, request_id: str, event: OutputEvent) -> None:
        events = self._streams.get(request_id)
        if events is None:
            return
        events.put_nowait(event)
        if isinstance(event, (Finished, Failed)):
            del self._streams[request_id]
