"""The engine's side of its connections: one started core serving every server process connected to it.

Each connection submits and cancels its own requests; their events go back on it, a turn of the loop's in one
`Events`. Every `STATE_PERIOD_S` each connection hears the core's `State` when that changed for it, else a
`Heartbeat` (a supervisor takes silence for a stall). One that goes away has its open requests aborted.
Connections arrive on a listening socket (`listen`; a replica actor's TCP) or are given (`join`; the engine
child's pipe)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import multiprocessing
import threading
import time
from multiprocessing.connection import Connection, Listener
from typing import Any

from prometheus_client import Histogram, generate_latest

from engine.api import EngineError, Failed, Finished, OutputEvent
from engine.core import EngineCore
from engine.handoff import AdmittedRequest
from engine.remote.media import HeldMedia
from engine.remote.messages import (
    STATE_PERIOD_S,
    Cancel,
    Closed,
    EngineSpec,
    Events,
    Heartbeat,
    Ready,
    Resend,
    State,
    Submit,
)
from engine.remote.pipe import portable, read_into, send

log = logging.getLogger(__name__)


class CoreService:
    """Owns the connections to a started core: which of them each open request belongs to, their submits, the events
    not yet sent, what each was last told of the core's state, and the task that tells them every `STATE_PERIOD_S`.
    Every method runs on `loop`, the core's."""

    def __init__(self, core: EngineCore, spec: EngineSpec, loop: asyncio.AbstractEventLoop) -> None:
        self.core = core
        self.spec = spec
        self.loop = loop
        self.clients: dict[Connection, int] = {}  # -> the submits it made
        self.routes: dict[str, Connection] = {}  # request id -> the connection that submitted it
        self.media = HeldMedia()  # the features and pixels its connections sent, which later requests name by key
        self._resent: dict[str, Connection] = {}  # requests asked for whole, not begun: a Cancel still ends them
        self._told: dict[Connection, State] = {}
        self._outbox: dict[Connection, list[OutputEvent]] = {}
        self._flush_scheduled = False
        self._listener: Listener | None = None
        self._closed = False
        self._beats = loop.create_task(self._beat(), name="engine-beat")
        # what a server process's request waits before the engine begins it, beside what it waited in the server
        # (decoding, the prompt): the pipe, its clips' and pictures' bytes, this loop's turn
        self.crossing = Histogram(
            "engine_request_crossing_seconds", "From a server process's send of a request to its engine's start of it",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0), registry=core.registry)

    def listen(self, address: Any, authkey: bytes, in_band: bool = False) -> Any:
        """Accept connections at `address` (a Unix socket's path, or a (host, port) for TCP) from whoever
        holds `authkey`: each hears `Ready` and then joins. `in_band`: for processes that are not our
        parent's children (engine/remote/pipe.py). Returns the address it listens at."""
        self._listener = Listener(address, authkey=authkey)
        threading.Thread(target=self._accept, args=(self._listener, in_band), name="engine-accept",
                         daemon=True).start()
        return self._listener.address

    def join(self, conn: Connection, read: bool = True) -> None:
        """Serve `conn`; `read=False`: its caller reads it, and hands its messages to `on_messages`."""
        self.clients[conn] = 0
        if self._told:  # what the others were told last: it need not wait a beat
            self._tell(conn, next(iter(self._told.values())))
        if read:
            read_into(conn, self.loop, functools.partial(self.on_messages, conn))

    def on_messages(self, conn: Connection, batch: list[Any]) -> None:
        for message in batch:
            match message:
                case Submit(request, sent_at):
                    if sent_at:  # the same host's clock (a replica elsewhere may differ: never below 0)
                        self.crossing.observe(max(0.0, time.time() - sent_at))
                    self._begin(conn, request)
                case Cancel(request_id):
                    if self._resent.pop(request_id, None) is not None:
                        send(conn, Events((Failed(request_id, "aborted"),)))
                    else:
                        self.core.abort(request_id)
                case Closed():
                    self.leave(conn)

    async def _beat(self) -> None:
        while True:
            health = self.core.health()
            # a core that is down has a stage that hung: the beat falls silent, so that the supervisor takes this
            # process for stalled, fails its requests and starts another
            if health.status != "down":
                state = State(self.core.stage_load(), generate_latest(self.core.registry).decode(), len(self.routes),
                              capacity=health.capacity)
                for conn in list(self.clients):
                    self._tell(conn, state)
            await asyncio.sleep(STATE_PERIOD_S)

    def leave(self, conn: Connection) -> None:
        if self.clients.pop(conn, None) is None:
            return
        self._told.pop(conn, None)
        for rid in [rid for rid, owner in self._resent.items() if owner is conn]:
            del self._resent[rid]
        for rid in [rid for rid, owner in self.routes.items() if owner is conn]:
            self.core.abort(rid)
        conn.close()

    async def stop(self) -> None:
        """Accept no one more, and stop the core: the Failed that ends each open request goes out."""
        self._closed = True
        self._beats.cancel()
        if self._listener is not None:
            self._listener.close()
        await self.core.stop()
        self.flush()

    def flush(self) -> None:
        self._flush_scheduled = False
        outbox, self._outbox = self._outbox, {}
        for conn, events in outbox.items():
            send(conn, Events(tuple(events)))  # one that is gone: its reader's Closed makes it leave

    def _accept(self, listener: Listener, in_band: bool) -> None:
        while True:
            try:
                conn = listener.accept()
                if in_band:
                    conn = portable(conn)
                conn.send(Ready(self.spec))
            except (OSError, EOFError, multiprocessing.AuthenticationError):
                if self._closed:
                    return  # the listener was closed
                continue
            try:
                self.loop.call_soon_threadsafe(self.join, conn)
            except RuntimeError:  # the loop is closed
                return

    def _tell(self, conn: Connection, state: State) -> None:
        state = dataclasses.replace(state, received=self.clients[conn])
        send(conn, state if state != self._told.get(conn) else Heartbeat())
        self._told[conn] = state

    def _begin(self, conn: Connection, request: AdmittedRequest) -> None:
        rid = request.request_id
        if conn not in self.clients:
            return  # it left: nobody would hear the request's events
        if self._resent.pop(rid, None) is None:
            self.clients[conn] += 1  # a request counts once, sent again or not (the server's load figure)
        if (whole := self.media.fill(request)) is None:
            log.info("request %s: it names a clip or image no longer held; asked for it whole", rid)
            self._resent[rid] = conn
            send(conn, Resend(rid))
            return
        request = whole
        self.routes[rid] = conn
        try:
            self.core.begin(request, functools.partial(self._queue, rid))
        except EngineError as e:
            self._queue(rid, Failed(rid, str(e), e.code, e.retry_after_s))
        except Exception as e:  # noqa: BLE001 - the server admitted it already: its stream must still end
            log.exception("request %s: the engine refused what the server admitted", rid)
            self._queue(rid, Failed(rid, f"internal error: {type(e).__name__}: {e}"))

    def _queue(self, request_id: str, event: OutputEvent) -> None:
        conn = self.routes.get(request_id)
        if isinstance(event, (Finished, Failed)):
            self.routes.pop(request_id, None)
        if conn is None or conn not in self.clients:
            return  # its server process left
        self._outbox.setdefault(conn, []).append(event)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)
