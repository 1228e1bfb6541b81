"""The server process's side of an engine in another process: an `EngineCore` that proxies over a pipe,
and keeps that engine serving.

`RemoteCore.spawn` starts a child of its own (`engine: process`); `RemoteCore.attach` joins one an
`EngineHost` started for several server processes (`serve --http-workers N`), and its `stop()` only
detaches: the child aborts what this process still had in flight.

Supervision (the profile's `supervision:`): the child speaks every `STATE_PERIOD_S`. When its pipe
closes (it exited) or it stays silent for `stall_timeout_s` (stalled: stopped, wedged; time this
process was stopped too does not count, engine/remote/silence.py), it is lost:
every open request ends with `Failed(code=UNAVAILABLE)`, `health()` says `down`, and a new request
is refused with `UNAVAILABLE` (the edge's 503, never a 400) until an engine serves again. A child of
our own is killed (a stopped one too), reaped and started again after `backoff_s` waits, doubling
from one failed attempt to the next. An attached process owns no child: its host starts the next one
at the same address (engine/remote/host.py), and this side connects again every `restart_backoff_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection
from multiprocessing.process import BaseProcess
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from engine.api import UNAVAILABLE, EngineError, EngineHealth, Failed
from engine.core import Sink, deliver
from engine.handoff import AdmittedRequest
from engine.metrics import ProcessMetrics
from engine.profile import SupervisionConfig
from engine.remote.child import START_TIMEOUT_S, spawn_child
from engine.remote.messages import (
    STATE_PERIOD_S,
    Address,
    Cancel,
    Closed,
    EngineSpec,
    Events,
    Heartbeat,
    Ready,
    StartFailed,
    State,
    Stop,
    Stopped,
    Submit,
)
from engine.remote.pipe import cut, read_into, send
from engine.remote.silence import Silence

log = logging.getLogger(__name__)

LATE_S = 4 * STATE_PERIOD_S  # silent past four turns of the child's loop: `degraded`, not yet a stall


class _PushedMetrics(Collector):
    """The child's engine metrics as last pushed, re-exposed from this process's registry."""

    def __init__(self) -> None:
        self.text = ""

    def collect(self) -> Iterable[Any]:
        return text_string_to_metric_families(self.text) if self.text else ()


@dataclass(frozen=True, slots=True)
class _Link:
    """One connection to one engine process, and that process when this side started it."""

    conn: Connection
    process: BaseProcess | None
    first: asyncio.Future[Any]  # its first message: Ready or StartFailed, or Closed
    stopped: asyncio.Future[None]  # its Stopped, or its end


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


class RemoteCore:
    """Owns the link to the engine process, the sinks of the requests sent over it, the child's last
    pushed state, and the supervision: whether the engine serves, and the task that watches it for a
    stall and starts (or reaches) another once it is lost."""

    def __init__(self, *, spec: EngineSpec | None = None, attach: Address | None = None) -> None:
        assert (spec is None) != (attach is None), "spawn a child for a spec, or attach to an address"
        self._spec = spec
        self.address = attach
        self._pushed = _PushedMetrics()
        self.registry = CollectorRegistry()
        self.registry.register(self._pushed)
        self._metrics = ProcessMetrics(self.registry)
        self._stage_load: dict[str, int] = {}
        self._sinks: dict[str, Sink] = {}
        self._link: _Link | None = None  # the engine process that serves, or is starting
        self._lost: _Link | None = None  # one lost and not yet reaped
        self._serving = False
        self._stopping = False
        self._silence = Silence()  # the serving link's
        self._serving_since = 0.0
        self._down = "not started"  # why it does not serve: health's detail
        self._cause = "exited"  # how it was last lost (exited, stalled): the restarts' label
        self._attempts = 0  # attempts in this run of restarts; a loss after a long serve begins a new run
        self._next_attempt_at = 0.0
        self._start_s = 0.0  # what the last start took: a down engine's Retry-After counts on as much
        self._restarts = 0
        self._supervisor: asyncio.Task[None] | None = None

    @classmethod
    def spawn(cls, spec: EngineSpec) -> RemoteCore:
        return cls(spec=spec)

    @classmethod
    def attach(cls, address: Address) -> RemoteCore:
        return cls(attach=address)

    @property
    def spec(self) -> EngineSpec:
        """What the engine process runs (known once it has started)."""
        assert self._spec is not None, "engine not started"
        return self._spec

    @property
    def supervision(self) -> SupervisionConfig:
        return self.spec.profile.supervision

    @property
    def pid(self) -> int | None:
        """The engine process this side started, while it serves or starts."""
        return self._link.process.pid if self._link is not None and self._link.process is not None else None

    async def start(self) -> None:
        await self._open()
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise(), name="engine-supervisor")

    async def stop(self) -> None:
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        link = self._link
        if link is not None and self._serving and link.process is not None:
            self._send(Stop())  # a child of ours stops its core; an attached one drops what we leave
            try:
                await asyncio.wait_for(link.stopped, timeout=30)
            except TimeoutError:
                log.error("engine process did not stop within 30 s")
            await asyncio.to_thread(link.process.join, 10)
        for gone in (link, self._lost):
            if gone is not None:
                self._drop(gone)
                await self._reap(gone)
        self._link = self._lost = None
        self._set_down("the server is shutting down")
        self._end_all("server shutting down")

    def begin(self, request: AdmittedRequest, sink: Sink) -> None:
        rid = request.request_id
        if not self._serving:
            raise self.health().refusal()
        if rid in self._sinks:
            raise EngineError(f"request id {rid} is already in use")
        self._sinks[rid] = sink
        self._send(Submit(request))

    def abort(self, request_id: str) -> None:
        if self._serving and request_id in self._sinks:
            self._send(Cancel(request_id))  # the child answers with the request's Failed("aborted")

    def stage_load(self) -> dict[str, int]:
        return dict(self._stage_load)

    def health(self) -> EngineHealth:
        now = time.monotonic()
        if self._serving:
            if (silent_s := self._silence.seconds) > LATE_S:
                return EngineHealth("degraded", f"no word from the engine process for {silent_s:.1f} s",
                                    self._restarts)
            return EngineHealth("ok", restarts=self._restarts)
        # the wait for the next attempt, then a start as long as the last one
        retry_after_s = max(1.0, self._next_attempt_at - now + self._start_s)
        return EngineHealth("down", self._down, self._restarts, retry_after_s)

    # -- the link
    async def _open(self) -> None:
        """Start (spawn) or reach (attach) an engine process and wait for its Ready; EngineError if none comes."""
        loop = asyncio.get_running_loop()
        began = time.monotonic()
        process = None
        if self.address is not None:
            try:
                conn = await asyncio.to_thread(Client, self.address[0], authkey=self.address[1])
            except (OSError, EOFError, AuthenticationError) as e:  # e.g. its host is starting the next one
                raise EngineError(f"cannot reach the engine process: {type(e).__name__}: {e}") from e
        else:
            try:
                process, conn = spawn_child(self.spec, None)
            except OSError as e:  # out of processes or descriptors: an attempt that failed, not the supervisor's end
                raise EngineError(f"cannot start the engine process: {e}") from e
        link = _Link(conn, process, loop.create_future(), loop.create_future())
        self._link = link
        read_into(conn, loop, functools.partial(self._on_messages, link))
        try:
            first = await asyncio.wait_for(link.first, START_TIMEOUT_S)
        except TimeoutError:
            first = None
        if not isinstance(first, Ready):
            self._link = None
            self._drop(link)
            await self._reap(link)
            if isinstance(first, StartFailed):
                raise EngineError(f"the engine process failed to start: {first.reason}")
            if first is None:
                raise EngineError(f"the engine process did not start within {START_TIMEOUT_S} s")
            raise EngineError("the engine process exited while starting")
        self._spec = first.spec
        self._start_s = time.monotonic() - began
        self._silence, self._serving_since = Silence(), time.monotonic()
        self._serving = True
        self._metrics.up.set(1)
        who = "attached" if self.address else f"{process.pid if process else '?'} ready"
        log.info("engine process %s: %s", who, self.spec.model)

    def _drop(self, link: _Link) -> None:
        """Let go at once: a child of ours is killed (a stopped one too), and the pipe is shut, so an
        attached engine hears we left and our reader ends."""
        if link.process is not None:
            link.process.kill()  # a no-op on one that already exited
        cut(link.conn)

    async def _reap(self, link: _Link) -> None:
        """Wait for a dropped child, so no zombie is left, and close the pipe."""
        if link.process is not None:
            await asyncio.to_thread(link.process.join, 10)
            log.info("engine process %d is gone (exit code %s)", link.process.pid, link.process.exitcode)
        link.conn.close()

    def _send(self, message: Submit | Cancel | Stop) -> None:
        assert self._link is not None
        if not send(self._link.conn, message):  # the child is gone; the reader's Closed ends every request
            log.error("engine process pipe is closed")

    def _on_messages(self, link: _Link, batch: list[Any]) -> None:
        if link is not self._link:
            return  # a lost link's last words
        self._silence.heard()
        for message in batch:
            match message:
                case Events(events):
                    for event in events:
                        deliver(self._sinks, event)
                case State(stage_load, metrics_text):
                    self._stage_load, self._pushed.text = stage_load, metrics_text
                case Heartbeat():
                    pass
                case Ready() | StartFailed():
                    _resolve(link.first, message)
                case Stopped():
                    _resolve(link.stopped, None)
                case Closed():
                    _resolve(link.first, message)
                    _resolve(link.stopped, None)
                    if self._serving and not self._stopping:
                        self._lose("exited", "the engine process exited")

    # -- supervision
    async def _supervise(self) -> None:
        """While the engine serves, watch it for a stall (an exit comes from the reader); once it is
        lost, reap it and try until another serves."""
        while True:
            while self._serving:
                await asyncio.sleep(STATE_PERIOD_S)
                silent_s = self._silence.look()
                if self._serving and silent_s > self.supervision.stall_timeout_s:
                    self._lose("stalled", f"the engine process stalled: no word from it for {silent_s:.1f} s")
            if self._lost is not None:
                await self._reap(self._lost)
                self._lost = None
            await self._restart()

    def _lose(self, cause: str, what: str) -> None:
        """The engine process exited or stalled: let go of it, and fail what it held."""
        assert self._link is not None
        now = time.monotonic()
        if now - self._serving_since > self.supervision.restart_backoff_max_s:
            self._attempts = 0  # it had served a good while: this loss begins a new run of restarts
        self._cause = cause
        self._next_attempt_at = now + self._backoff_s()
        self._lost, self._link = self._link, None
        self._drop(self._lost)
        self._set_down(f"{what}; {'restarting it' if self.address is None else 'reconnecting'}")
        log.error("%s: %d open requests fail", what, len(self._sinks))
        self._end_all(what, UNAVAILABLE, self.health().retry_after_s)

    async def _restart(self) -> None:
        """Attempts, with back-off, until an engine process serves again."""
        verb = "restart" if self.address is None else "reconnect"
        while True:
            self._attempts += 1
            wait_s = max(0.0, self._next_attempt_at - time.monotonic())
            # an attached process retries every second or so while its host starts the next engine: only the
            # first attempt of a run is worth a line
            level = logging.WARNING if self.address is None or self._attempts == 1 else logging.DEBUG
            log.log(level, "engine process: %s attempt %d in %.1f s", verb, self._attempts, wait_s)
            await asyncio.sleep(wait_s)
            try:
                await self._open()
            except EngineError as e:
                log.log(level, "engine process: %s attempt %d failed: %s", verb, self._attempts, e)
                self._next_attempt_at = time.monotonic() + self._backoff_s()
                continue
            self._restarts += 1
            self._metrics.restarts.labels(self._cause).inc()
            log.warning("engine process: serving again after %s attempt %d (%d since the server started)",
                        verb, self._attempts, self._restarts)
            return

    def _backoff_s(self) -> float:
        if self.address is not None:
            return self.supervision.restart_backoff_s  # the host backs off; we only look for its next engine
        return self.supervision.backoff_s(self._attempts)

    def _set_down(self, why: str) -> None:
        self._serving = False
        self._down = why
        self._stage_load, self._pushed.text = {}, ""  # the lost engine's figures say nothing of the next
        self._metrics.up.set(0)

    def _end_all(self, reason: str, code: str | None = None, retry_after_s: float | None = None) -> None:
        sinks, self._sinks = self._sinks, {}
        for rid, sink in sinks.items():
            sink(Failed(rid, reason, code, retry_after_s))
