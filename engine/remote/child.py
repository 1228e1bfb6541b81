"""The engine's process: the core runs here, serving the pipe of the server process that started it and,
for `serve --http-workers N`, any number of server processes that attach over a Unix socket.

In one process the server's event loop shares Python's GIL with the stage threads: every time the
loop gives the GIL up (each socket read and write, each wait for events) it waits to get it back
while a stage thread runs Python, up to the 5 ms switch interval a time. At c=64 that put tens of
milliseconds between a request's arrival and its start, and between an audio chunk and its bytes
(docs/performance.md). Here the stages run in a child with a GIL of their own; the server's
process keeps HTTP, JSON, base64 and admission.

One server process is one event loop, and a burst of arrivals queues on it. With `EngineHost` the
child also listens on a Unix socket: each server process gets its own connection, its requests'
events come back on it, and one that goes away loses only its own requests. If the owner's pipe
closes (the parent died), the child stops. Every `STATE_PERIOD_S` each of them hears from it, its
state or a heartbeat, and so does a host's pipe: that is how a supervisor tells a stall.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing
import signal
import threading
from multiprocessing.connection import Connection, Listener
from multiprocessing.process import BaseProcess
from typing import Any

from prometheus_client import generate_latest

from engine.api import EngineError, Failed, Finished, OutputEvent
from engine.core import EngineCore
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
from engine.remote.pipe import read_into, send
from engine.weights.source import ModelSource

log = logging.getLogger(__name__)

START_TIMEOUT_S = 1800  # a full-size model with its graphs and compiles takes minutes


def spawn_child(spec: EngineSpec, listen: Address | None) -> tuple[BaseProcess, Connection]:
    """Start the engine's child process; returns it and the pipe to it (its owner's end)."""
    ctx = multiprocessing.get_context("spawn")  # a fork would copy the parent's threads and locks
    conn, child_conn = ctx.Pipe()
    process = ctx.Process(target=_child_main, args=(child_conn, spec, logging.getLogger().level, listen),
                          name="voice-gateway-engine", daemon=True)
    process.start()
    child_conn.close()
    return process, conn


def _child_main(conn: Connection, spec: EngineSpec, log_level: int, listen: Address | None) -> None:
    # the parent decides when to stop: Ctrl-C reaches the whole process group
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s [engine]: %(message)s")
    try:
        asyncio.run(_ChildServer(conn, spec, listen).run())
    finally:
        conn.close()


class _ChildServer:
    """Runs the core and answers its clients: the owner alone, or (with `listen`) every server process
    that connects to the socket, the owner then only starting and stopping it."""

    def __init__(self, owner: Connection, spec: EngineSpec, listen: Address | None) -> None:
        self.owner = owner
        self.spec = spec
        self.listen = listen
        self.core: EngineCore | None = None
        self.clients: list[Connection] = [] if listen else [owner]  # those that submit and hear events
        self.routes: dict[str, Connection] = {}  # request id -> the client that submitted it
        self.outbox: dict[Connection, list[OutputEvent]] = {}
        self.flush_scheduled = False
        self.done: asyncio.Future[None] | None = None
        self.last_state: State | None = None

    async def run(self) -> None:
        from engine.local import load_core  # the child alone loads the stages

        loop = asyncio.get_running_loop()
        try:
            source = ModelSource.open(self.spec.model, self.spec.profile.load_format, self.spec.cache_dir)
            self.core = load_core(source, self.spec.profile)
            await self.core.start()
        except Exception as e:
            log.exception("engine failed to start")
            send(self.owner, StartFailed(f"{type(e).__name__}: {e}"))
            return
        core = self.core
        self.done = loop.create_future()
        listener = None
        if self.listen is not None:  # listening before Ready: the owner lets server processes attach on it
            listener = Listener(self.listen[0], authkey=self.listen[1])
            threading.Thread(target=self._accept, args=(listener, loop), name="engine-accept", daemon=True).start()
        send(self.owner, Ready(self.spec))
        read_into(self.owner, loop, functools.partial(self._on_messages, self.owner))
        while not self.done.done():
            # every turn each client hears something, and a host's pipe too: their supervisors take silence
            # for a stall (engine/remote/messages.py)
            state = State(core.stage_load(), generate_latest(core.registry).decode())
            news = state if state != self.last_state else Heartbeat()
            for client in list(self.clients):
                send(client, news)
            if self.listen is not None:
                send(self.owner, Heartbeat())
            self.last_state = state
            await asyncio.wait([self.done], timeout=STATE_PERIOD_S)
        if listener is not None:
            listener.close()
        await core.stop()  # ends every open request with Failed
        self._flush()
        send(self.owner, Stopped())

    def _accept(self, listener: Listener, loop: asyncio.AbstractEventLoop) -> None:
        """Socket -> a new client: it gets the engine's description, then joins at the loop's next turn."""
        while True:
            try:
                conn = listener.accept()
                conn.send(Ready(self.spec))
            except (OSError, EOFError, multiprocessing.AuthenticationError):
                if self.done is not None and self.done.done():
                    return  # the listener was closed
                continue
            try:
                loop.call_soon_threadsafe(self._join, conn, loop)
            except RuntimeError:
                return

    def _join(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        self.clients.append(conn)
        if self.last_state is not None:
            send(conn, self.last_state)
        read_into(conn, loop, functools.partial(self._on_messages, conn))

    def _on_messages(self, conn: Connection, batch: list[Any]) -> None:
        assert self.core is not None
        for message in batch:
            match message:
                case Submit(request):
                    self._begin(conn, request)
                case Cancel(request_id):
                    self.core.abort(request_id)
                case Stop():
                    self._stop()
                case Closed():
                    self._leave(conn)

    def _begin(self, conn: Connection, request: Any) -> None:
        assert self.core is not None
        rid = request.request_id
        self.routes[rid] = conn
        try:
            self.core.begin(request, functools.partial(self._queue, rid))
        except Exception as e:  # noqa: BLE001 - the server admitted it already: its stream must still end
            log.exception("request %s: the engine refused what the server admitted", rid)
            self._queue(rid, Failed(rid, str(e) if isinstance(e, EngineError) else f"internal error: {type(e).__name__}: {e}"))

    def _leave(self, conn: Connection) -> None:
        """A vanished owner stops the engine; a vanished server process only loses its requests."""
        if conn is self.owner:
            self._stop()
            return
        if conn in self.clients:
            self.clients.remove(conn)
            assert self.core is not None
            for rid in [rid for rid, owner in self.routes.items() if owner is conn]:
                self.core.abort(rid)
            conn.close()

    def _stop(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    def _queue(self, request_id: str, event: OutputEvent) -> None:
        conn = self.routes.get(request_id)
        if isinstance(event, (Finished, Failed)):
            self.routes.pop(request_id, None)
        if conn is None or conn not in self.clients:
            return  # its server process left
        self.outbox.setdefault(conn, []).append(event)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        outbox, self.outbox = self.outbox, {}
        for conn, events in outbox.items():
            if not send(conn, Events(tuple(events))) and conn is self.owner:
                self._stop()
