"""The server process's side of an engine in another process: an `EngineCore` that proxies over a pipe.

`RemoteCore.spawn` starts a child of its own (`engine: process`); `RemoteCore.attach` joins one an
`EngineHost` started for several server processes (`serve --http-workers N`), and its `stop()` only
detaches: the child aborts what this process still had in flight. If the child dies, every open
request ends with `Failed` and new ones are refused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from multiprocessing.connection import Client, Connection
from multiprocessing.process import BaseProcess
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from engine.api import EngineError, Failed, Finished
from engine.core import Sink
from engine.handoff import AdmittedRequest
from engine.remote.child import START_TIMEOUT_S, spawn_child
from engine.remote.messages import (
    Address,
    Cancel,
    Closed,
    EngineSpec,
    Events,
    Ready,
    StartFailed,
    State,
    Stop,
    Stopped,
    Submit,
)
from engine.remote.pipe import read_into, send

log = logging.getLogger(__name__)


class _PushedMetrics(Collector):
    """The child's engine metrics as last pushed, re-exposed from this process's registry."""

    def __init__(self) -> None:
        self.text = ""

    def collect(self) -> Iterable[Any]:
        return text_string_to_metric_families(self.text) if self.text else ()


class RemoteCore:
    """Owns the pipe, the sinks of the requests sent over it and the child's last pushed state."""

    def __init__(self, *, spec: EngineSpec | None = None, attach: Address | None = None) -> None:
        assert (spec is None) != (attach is None), "spawn a child for a spec, or attach to an address"
        self._spec = spec
        self.address = attach
        self._pushed = _PushedMetrics()
        self.registry = CollectorRegistry()
        self.registry.register(self._pushed)
        self._stage_load: dict[str, int] = {}
        self._sinks: dict[str, Sink] = {}
        self._conn: Connection | None = None
        self._process: BaseProcess | None = None
        self._alive = False
        self._stopping = False
        self._stopped: asyncio.Future[None] | None = None

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

    async def start(self) -> None:
        if self.address is not None:
            address, authkey = self.address
            conn = await asyncio.to_thread(Client, address, authkey=authkey)
        else:
            self._process, conn = spawn_child(self.spec, None)
        self._conn = conn
        if not await asyncio.to_thread(conn.poll, START_TIMEOUT_S):
            raise EngineError(f"the engine process did not start within {START_TIMEOUT_S} s")
        first = await asyncio.to_thread(conn.recv)
        if isinstance(first, StartFailed):
            raise EngineError(f"the engine process failed to start: {first.reason}")
        assert isinstance(first, Ready), first
        self._spec = first.spec
        self._alive = True
        loop = asyncio.get_running_loop()
        self._stopped = loop.create_future()
        read_into(conn, loop, self._on_messages)
        who = "attached" if self.address else f"{self._process.pid if self._process else '?'} ready"
        log.info("engine process %s: %s", who, self.spec.model)

    async def stop(self) -> None:
        self._stopping = True
        if self.address is not None:
            if self._conn is not None:
                self._conn.close()  # the child aborts what this process had in flight
            self._end_all("server shutting down")
            return
        if self._alive and self._stopped is not None:
            self._send(Stop())
            try:
                await asyncio.wait_for(asyncio.shield(self._stopped), timeout=30)
            except TimeoutError:
                log.error("engine process did not stop within 30 s")
        if self._process is not None:
            await asyncio.to_thread(self._process.join, 10)
            if self._process.is_alive():
                self._process.kill()
        self._end_all("server shutting down")

    def begin(self, request: AdmittedRequest, sink: Sink) -> None:
        rid = request.request_id
        if not self._alive:
            raise EngineError("the engine process is not running")
        if rid in self._sinks:
            raise EngineError(f"request id {rid} is already in use")
        self._sinks[rid] = sink
        self._send(Submit(request))

    def abort(self, request_id: str) -> None:
        if self._alive and request_id in self._sinks:
            self._send(Cancel(request_id))  # the child answers with the request's Failed("aborted")

    def stage_load(self) -> dict[str, int]:
        return dict(self._stage_load)

    def _send(self, message: Submit | Cancel | Stop) -> None:
        assert self._conn is not None
        if not send(self._conn, message):  # the child is gone; the reader's Closed ends every request
            log.error("engine process pipe is closed")

    def _on_messages(self, batch: list[Any]) -> None:
        for message in batch:
            match message:
                case Events(events):
                    for event in events:
                        sink = self._sinks.get(event.request_id)
                        if sink is None:
                            continue
                        if isinstance(event, (Finished, Failed)):
                            del self._sinks[event.request_id]
                        sink(event)
                case State(stage_load, metrics_text):
                    self._stage_load, self._pushed.text = stage_load, metrics_text
                case Stopped():
                    self._resolve_stopped()
                case Closed():
                    self._lost()

    def _resolve_stopped(self) -> None:
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)

    def _lost(self) -> None:
        self._resolve_stopped()
        if self._alive and not self._stopping:
            log.error("engine process exited")
            self._end_all("the engine process exited")

    def _end_all(self, reason: str) -> None:
        self._alive = False
        sinks, self._sinks = self._sinks, {}
        for rid, sink in sinks.items():
            sink(Failed(rid, reason))
