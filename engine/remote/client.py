"""The server process's side of an engine in another process: `RemoteCore`, an `EngineCore` that proxies over one
connection to it and keeps it serving, however it is reached (`Reach`: our own child, an `EngineHost`'s socket,
a replica on Ray).

The engine speaks every `STATE_PERIOD_S`; when its connection closes or it is silent for `stall_timeout_s`
(silence.py), it is lost: open requests end with `Failed(code=UNAVAILABLE)`, `health()` says `down`, and new
requests are refused with `UNAVAILABLE` (a 503) until an engine serves again, reached after the reach's waits.
Its load is what its last state said, plus what this process sent since, less what ended: the router weighs it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from engine.api import UNAVAILABLE, EngineError, EngineHealth, Failed
from engine.core import Sink, deliver
from engine.handoff import AdmittedRequest
from engine.metrics import ProcessMetrics
from engine.profile import SupervisionConfig
from engine.remote.media import SentMedia
from engine.remote.messages import (
    STATE_PERIOD_S,
    Cancel,
    Closed,
    EngineSpec,
    Events,
    Resend,
    State,
    Stop,
    Stopped,
    Submit,
)
from engine.remote.pipe import cut, read_into, send
from engine.remote.silence import Silence

log = logging.getLogger(__name__)

LATE_S = 4 * STATE_PERIOD_S  # silent past four of the engine's beats: `degraded`, not yet a stall
STOP_TIMEOUT_S = 30  # an engine of our own that is told to stop ends its requests by then


class Reach(ABC):
    """How a `RemoteCore` reaches its engine. By default the engine's owner replaces a lost one: this side looks."""

    what: str  # how logs and health name the engine
    verb = "reconnect"  # what an attempt after a loss does, for the log
    recovery: str  # what happens after a loss, for health's detail
    owns_engine = False  # stop() stops the engine, rather than only leaving it
    pid: int | None = None  # the engine's process, once known
    ready: str  # the log's words for an engine that serves (which, and its process), once it does

    @abstractmethod
    async def open(self) -> tuple[Connection, EngineSpec]:
        """A connection to the engine after its `Ready`, and what it runs; EngineError if none serves, and
        then (even when cancelled) nothing of the attempt is left running."""

    def lost(self, stalled: bool) -> None:  # noqa: B027
        """It exited or stalled: let go of it at once."""

    async def reap(self) -> None:  # noqa: B027
        """Wait for an engine of ours that was let go of or stopped, so no zombie is left."""

    def backoff_s(self, supervision: SupervisionConfig, attempts: int) -> float:
        """The wait before the next attempt, after `attempts` in this run of them."""
        return supervision.restart_backoff_s


class PushedFamilies(Collector):
    """Engines' metrics as each last pushed them, re-exposed here with its `labels`: one family per name."""

    def __init__(self, engines: Callable[[], Iterable[tuple[dict[str, str], str]]]) -> None:
        self._engines = engines  # -> (labels, metrics text) of each

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, Metric] = {}
        for labels, text in self._engines():
            for family in text_string_to_metric_families(text) if text else ():
                out = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                out.samples += [s._replace(labels={**s.labels, **labels}) for s in family.samples]
        return merged.values()


class RemoteCore:
    """Owns the connection to the engine, the sinks of the requests sent on it (and how many it sent and saw end),
    the clips and images it sent (media.py), the engine's last pushed state, and the supervision: whether the
    engine serves, its restarts, and the task that watches for a stall and reaches another once it is lost."""

    def __init__(self, reach: Reach) -> None:
        self.reach = reach
        self._spec: EngineSpec | None = None  # what the engine runs, from its Ready
        self._state = State({}, "")  # its last, on this connection
        self.registry = CollectorRegistry()
        self.registry.register(PushedFamilies(lambda: [({}, self._state.metrics_text)]))
        self._metrics = ProcessMetrics(self.registry)
        self._sinks: dict[str, Sink] = {}
        self._conn: Connection | None = None  # the serving engine's
        self._stopped = asyncio.Event()  # it said Stopped, or its connection closed
        self.serving = False
        self._stopping = False
        self._silence = Silence()  # on this connection
        self._sent = self._ended = self._ended_at_state = 0  # on this connection
        self._media = SentMedia()  # the clips and images sent on this connection, which its engine holds
        self._whole: dict[str, AdmittedRequest] = {}  # requests sent without some media, until the engine begins them
        self._down = "not started"  # why it does not serve: health's detail
        self._cause = "exited"  # how it was last lost (exited, stalled): the restarts' label
        self._serving_since = 0.0
        self._attempts = 0  # attempts in this run of them; a loss after a long serve begins a new run
        self._next_attempt_at = 0.0
        self._start_s = 0.0  # what the last start took: a down engine's Retry-After counts on as much
        self.restarts = 0  # times it served again after it was lost
        self._supervisor: asyncio.Task[None] | None = None

    @property
    def spec(self) -> EngineSpec:
        assert self._spec is not None, "engine not started"
        return self._spec

    @property
    def supervision(self) -> SupervisionConfig:
        return self.spec.profile.engine.supervision

    @property
    def pid(self) -> int | None:
        return self.reach.pid

    @property
    def metrics_text(self) -> str:
        return self._state.metrics_text

    @property
    def load(self) -> int:
        """Requests the engine runs, for every server process, as far as this one knows."""
        unseen = self._sent - self._state.received
        return max(0, self._state.open_requests + unseen - (self._ended - self._ended_at_state))

    async def start(self) -> None:
        await self._open()
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise(), name=f"{self.reach.what} supervisor")

    async def stop(self) -> None:
        """Every request of this process ends; an engine of our own is stopped, any other is only left."""
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        if self._conn is not None and self.serving and self.reach.owns_engine:
            send(self._conn, Stop())  # it fails what it still holds, and says Stopped
            try:
                await asyncio.wait_for(self._stopped.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                log.error("%s did not stop within %d s", self.reach.what, STOP_TIMEOUT_S)
        self._set_down("the server is shutting down")
        self._end_all("server shutting down")
        self._cut()
        await self.reach.reap()

    def begin(self, request: AdmittedRequest, sink: Sink) -> None:
        rid = request.request_id
        if not self.serving or self._conn is None:
            raise self.health().refusal()
        if rid in self._sinks:
            raise EngineError(f"request id {rid} is already in use")
        self._sinks[rid] = sink
        self._sent += 1
        wire = self._media.strip(request)
        if self._media.leaves_out(wire):
            self._whole[rid] = request
        if not send(self._conn, Submit(wire, time.time())):  # the reader's Closed ends it with the others
            log.error("%s: its connection is closed", self.reach.what)

    def _resend(self, request_id: str) -> None:
        """The engine let go of a clip or image this request named: send it with all of them."""
        request = self._whole.pop(request_id, None)
        if request is None or request_id not in self._sinks or self._conn is None:
            return  # it ended meanwhile
        self._media.forget(request)
        log.info("request %s: sent again with its clips and images, which %s no longer held", request_id,
                 self.reach.what)
        send(self._conn, Submit(self._media.strip(request), time.time()))

    def abort(self, request_id: str) -> None:
        self._whole.pop(request_id, None)  # a resend asked for now finds nothing to send: the engine ends it
        if self._conn is not None and request_id in self._sinks:
            send(self._conn, Cancel(request_id))  # the engine answers with the request's Failed("aborted")

    def stage_load(self) -> dict[str, int]:
        return dict(self._state.stage_load)

    def health(self) -> EngineHealth:
        if self.serving:
            if (silent_s := self._silence.seconds) > LATE_S:
                return EngineHealth("degraded", f"no word from {self.reach.what} for {silent_s:.1f} s", self.restarts)
            return EngineHealth("ok", restarts=self.restarts, capacity=self._state.capacity)
        # the wait for the next attempt, then a start as long as the last one
        retry_after_s = max(1.0, self._next_attempt_at - time.monotonic() + self._start_s)
        return EngineHealth("down", self._down, self.restarts, retry_after_s)

    async def _open(self) -> None:
        began = time.monotonic()
        conn, self._spec = await self.reach.open()
        self._start_s = time.monotonic() - began
        self._conn, self._stopped = conn, asyncio.Event()
        self._sent = self._ended = self._ended_at_state = 0
        self._media.clear()  # a new engine holds none of them
        self._whole.clear()
        self._silence, self._serving_since = Silence(), time.monotonic()
        self.serving = True
        self._metrics.up.set(1)
        read_into(conn, asyncio.get_running_loop(), functools.partial(self._on_messages, conn))
        log.info("%s: %s", self.reach.ready, self.spec.model)

    def _on_messages(self, conn: Connection, batch: list[Any]) -> None:
        if isinstance(batch[-1], Closed):
            conn.close()  # its reader is done with it
        if conn is not self._conn:
            return  # a lost connection's last words
        self._silence.heard()
        for message in batch:
            match message:
                case Events(events):
                    for event in events:
                        self._whole.pop(event.request_id, None)  # begun: no resend will come
                        self._ended += deliver(self._sinks, event)
                case Resend(request_id):
                    self._resend(request_id)
                case State():
                    self._state, self._ended_at_state = message, self._ended
                case Stopped():
                    self._stopped.set()
                case Closed():
                    self._stopped.set()
                    if self.serving and not self._stopping:
                        self._lose("exited", f"{self.reach.what} exited")

    def _cut(self) -> None:
        """Let go of the connection at once: the engine aborts what this process had open there; our reader ends."""
        conn, self._conn = self._conn, None
        if conn is not None:
            cut(conn)

    async def _supervise(self) -> None:
        """While the engine serves, watch it for a stall; once it is lost, reap it and try until another serves."""
        while True:
            while self.serving:
                await asyncio.sleep(STATE_PERIOD_S)
                silent_s = self._silence.look()
                if self.serving and silent_s > self.supervision.stall_timeout_s:
                    self._lose("stalled", f"{self.reach.what} stalled: no word from it for {silent_s:.1f} s")
            await self.reach.reap()
            await self._restart()

    def _lose(self, cause: str, what: str) -> None:
        now = time.monotonic()
        if now - self._serving_since > self.supervision.restart_backoff_max_s:
            self._attempts = 0  # it had served a good while: this loss begins a new run of attempts
        self._cause = cause
        self._next_attempt_at = now + self.reach.backoff_s(self.supervision, self._attempts)
        self._set_down(f"{what}; {self.reach.recovery}")
        self._cut()
        self.reach.lost(stalled=cause == "stalled")
        log.error("%s: %d open requests fail", what, len(self._sinks))
        self._end_all(what, UNAVAILABLE, self.health().retry_after_s)

    async def _restart(self) -> None:
        while True:
            self._attempts += 1
            wait_s = max(0.0, self._next_attempt_at - time.monotonic())
            # one that a host or Ray replaces is looked for every second or so: only a run's first attempt
            # is worth a line
            level = logging.WARNING if self.reach.owns_engine or self._attempts == 1 else logging.DEBUG
            log.log(level, "%s: %s attempt %d in %.1f s", self.reach.what, self.reach.verb, self._attempts, wait_s)
            await asyncio.sleep(wait_s)
            try:
                await self._open()
            except EngineError as e:
                log.log(level, "%s: %s attempt %d failed: %s", self.reach.what, self.reach.verb, self._attempts, e)
                self._next_attempt_at = time.monotonic() + self.reach.backoff_s(self.supervision, self._attempts)
                continue
            self.restarts += 1
            self._metrics.restarts.labels(self._cause).inc()
            log.warning("%s: serving again after %s attempt %d (%d since the server started)", self.reach.what,
                        self.reach.verb, self._attempts, self.restarts)
            return

    def _set_down(self, why: str) -> None:
        self.serving = False
        self._down = why
        self._state = State({}, "")  # the lost engine's figures say nothing of the next
        self._metrics.up.set(0)

    def _end_all(self, reason: str, code: str | None = None, retry_after_s: float | None = None) -> None:
        sinks, self._sinks = self._sinks, {}
        self._whole.clear()
        self._ended += len(sinks)
        for rid, sink in sinks.items():
            sink(Failed(rid, reason, code, retry_after_s))
