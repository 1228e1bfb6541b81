"""The `Engine` the network edge talks to: the intake at the front door, the work in a core.

`Frontend` owns the open request streams. Each request is admitted here, then begun in the core, whose events
come back to the request's own queue; closing a stream early aborts its request. The core is a backend's stages
in this process, or a proxy to them in another: the front end is the same for all. Its health is the core's while
it runs, and `down` before its start and from its stop."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from engine.api import (
    EngineError,
    EngineHealth,
    EngineRequest,
    Failed,
    Finished,
    ModelInfo,
    OutputEvent,
)
from engine.core import EngineCore
from engine.intake.intake import Intake


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
    """`intake`: the front door, or how to open it once the core has started (an engine process
    that other server processes started, whose model and profile this process learns from it)."""

    def __init__(self, core: EngineCore, intake: Intake | Callable[[], Intake]) -> None:
        self.core = core
        self._intake = intake if isinstance(intake, Intake) else None
        self._open_intake = None if isinstance(intake, Intake) else intake
        self._streams: dict[str, asyncio.Queue[OutputEvent]] = {}
        self._running = False

    @property
    def intake(self) -> Intake:
        assert self._intake is not None, "engine not started"
        return self._intake

    @property
    def info(self) -> ModelInfo:
        return self.intake.info

    @property
    def registry(self) -> CollectorRegistry:
        return self.core.registry

    async def start(self) -> None:
        await self.core.start()
        if self._open_intake is not None:
            self._intake = await asyncio.to_thread(self._open_intake)
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
        admitted = await self.intake.admit(request)
        if rid in self._streams:  # checked again: the intake may have awaited
            raise EngineError(f"request id {rid} is already in use")
        events: asyncio.Queue[OutputEvent] = asyncio.Queue()
        self._streams[rid] = events
        try:
            self.core.begin(admitted, functools.partial(self._deliver, rid))
        except BaseException:
            self._streams.pop(rid, None)
            raise
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
