"""The gate: how many replies the stages run at once, and how long the others may wait (the profile's `admission`).

The stages batch whatever they hold, so past their batch every reply slows down together and replies stutter.
`Gate` is an `EngineCore` in front of the real one that keeps the running replies within the stages' batch and,
where the core says what its KV pools hold (`Pools`), within them too (a reply holds its place and its room from
its start to its last audio chunk), so that no reply waits for pages inside the stages while its caller's
deadline runs; the next `max_queued` requests wait in arrival
order, each at most `queue_timeout_s` (a turn of a live conversation, whose caller cannot try again, at most
`live_queue_timeout_s`), and the rest are refused at once with `Failed(OVERLOADED)` and a `retry_after_s` (the
edge's 429, or a failed realtime response). It lives next to the stages, so server processes in front of one engine
share one count."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from engine.api import OVERLOADED, EngineError, EngineHealth, Failed, Finished, OutputEvent
from engine.core import EngineCore, Pools, Sink
from engine.handoff import AdmittedRequest
from engine.profile import AdmissionConfig

log = logging.getLogger(__name__)

LONG_WAIT_S = 1.0  # a request that waited longer for its place is logged: its caller heard the silence


class GateMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.queued = Gauge("engine_admission_queue_depth", "Requests waiting for a place", registry=registry)
        self.wait = Histogram("engine_admission_wait_seconds", "Time admitted requests waited for a place",
                              buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0), registry=registry)
        self.refused = Counter("engine_admission_refused", "Requests refused as overloaded, by why",
                               ["reason"], registry=registry)


@dataclass(slots=True)
class _Waiting:
    request: AdmittedRequest
    sink: Sink
    since: float
    timer: asyncio.TimerHandle | None
    timeout_s: float


class Gate:
    """Owns the running count and the queue; `core` does the work."""

    def __init__(self, core: EngineCore, *, max_active: int, max_queued: int, queue_timeout_s: float,
                 live_queue_timeout_s: float, pools: Pools | None = None) -> None:
        self.core = core
        self.pools = pools
        self.registry = core.registry
        self.max_active = max_active
        self.max_queued = max_queued
        self.queue_timeout_s = queue_timeout_s
        # a caller who cannot try again never waits less than one who can
        self.live_queue_timeout_s = max(live_queue_timeout_s, queue_timeout_s)
        self.metrics = GateMetrics(core.registry)
        self._active: dict[str, tuple[int, int]] = {}  # request id -> the room it holds
        self._held = (0, 0)  # Thinker positions, Talker rows
        self._waiting: OrderedDict[str, _Waiting] = OrderedDict()
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def for_profile(cls, core: EngineCore, admission: AdmissionConfig, capacity: int, pools: Pools | None = None) -> Gate:
        """`capacity`: the replies the core's stages run at once (the smallest batch among them)."""
        return cls(core, max_active=admission.max_active or capacity, max_queued=admission.max_queued,
                   queue_timeout_s=admission.queue_timeout_s, live_queue_timeout_s=admission.live_queue_timeout_s,
                   pools=pools)

    @property
    def retry_after_s(self) -> float:
        return max(1.0, self.queue_timeout_s)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self.core.start()

    async def stop(self) -> None:
        for rid in list(self._waiting):
            self._drop(rid).sink(Failed(rid, "server shutting down"))
        await self.core.stop()

    def stage_load(self) -> dict[str, int]:
        return self.core.stage_load()

    def health(self) -> EngineHealth:
        return self.core.health()

    def begin(self, request: AdmittedRequest, sink: Sink) -> None:
        rid = request.request_id
        if rid in self._active or rid in self._waiting:
            raise EngineError(f"request id {rid} is already in use")
        timeout_s = self.live_queue_timeout_s if request.live_turn else self.queue_timeout_s
        if self._fits(request) and not self._waiting:
            self._run(request, sink)
        elif len(self._waiting) < self.max_queued and timeout_s > 0:
            assert self._loop is not None, "gate not started"
            timer = self._loop.call_later(timeout_s, self._expire, rid)
            self._waiting[rid] = _Waiting(request, sink, time.perf_counter(), timer, timeout_s)
            self.metrics.queued.set(len(self._waiting))
        else:
            self._refuse(rid, sink, "full", f"the server is at capacity ({len(self._active)} replies running"
                         f"{self._pools_held()}, {len(self._waiting)} waiting): try again later")

    def abort(self, request_id: str) -> None:
        if request_id in self._waiting:
            self._drop(request_id).sink(Failed(request_id, "aborted"))
        else:
            self.core.abort(request_id)

    def _fits(self, request: AdmittedRequest) -> bool:
        if len(self._active) >= self.max_active:
            return False
        if self.pools is None:
            return True
        positions, rows = self.pools.room(request)
        held_positions, held_rows = self._held
        # the first reply always goes in: the plan sized each pool for one of the whole context
        return not self._active or (held_positions + positions <= self.pools.thinker_positions
                                    and held_rows + rows <= self.pools.talker_rows)

    def _pools_held(self) -> str:
        if self.pools is None:
            return ""
        return (f", holding {self._held[0]:,} of {self.pools.thinker_positions:,} Thinker positions and "
                f"{self._held[1]:,} of {self.pools.talker_rows:,} Talker rows")

    def _hold(self, request_id: str, room: tuple[int, int] | None) -> None:
        """Take `room` for `request_id`, or (None) give back what it held."""
        if room is None:
            room = self._active.pop(request_id, None)
            sign = -1
        else:
            self._active[request_id], sign = room, 1
        if room is not None:
            self._held = (self._held[0] + sign * room[0], self._held[1] + sign * room[1])

    def _run(self, request: AdmittedRequest, sink: Sink) -> None:
        rid = request.request_id
        self._hold(rid, self.pools.room(request) if self.pools is not None else (0, 0))

        def relay(event: OutputEvent) -> None:
            if isinstance(event, (Finished, Failed)):
                self._hold(rid, None)
                sink(event)
                self._admit_waiting()
            else:
                sink(event)

        try:
            self.core.begin(request, relay)
        except BaseException:
            self._hold(rid, None)
            raise

    def _admit_waiting(self) -> None:
        while self._waiting and self._fits(self._waiting[next(iter(self._waiting))].request):
            rid = next(iter(self._waiting))
            waiting = self._drop(rid)
            waited_s = time.perf_counter() - waiting.since
            self.metrics.wait.observe(waited_s)
            if waited_s > LONG_WAIT_S:
                log.info("request %s%s waited %.2f s for a place (%d replies running%s, %d waiting)", rid,
                         " (a live turn)" if waiting.request.live_turn else "", waited_s, len(self._active),
                         self._pools_held(), len(self._waiting))
            try:
                self._run(waiting.request, waiting.sink)
            except EngineError as e:
                waiting.sink(Failed(rid, str(e), e.code, e.retry_after_s))

    def _expire(self, request_id: str) -> None:
        if request_id in self._waiting:
            waiting = self._drop(request_id)
            what = "this turn of a live conversation" if waiting.request.live_turn else "this request"
            self._refuse(request_id, waiting.sink, "timeout",
                         f"the server is at capacity: no place for {what} within {waiting.timeout_s:g} s")

    def _drop(self, request_id: str) -> _Waiting:
        waiting = self._waiting.pop(request_id)
        if waiting.timer is not None:
            waiting.timer.cancel()
        self.metrics.queued.set(len(self._waiting))
        return waiting

    def _refuse(self, request_id: str, sink: Sink, reason: str, message: str) -> None:
        self.metrics.refused.labels(reason).inc()
        log.warning("request %s refused (%s): %s", request_id, reason, message)
        sink(Failed(request_id, message, OVERLOADED, self.retry_after_s))
