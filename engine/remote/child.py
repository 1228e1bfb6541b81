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
import logging
import multiprocessing
import signal
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from engine.heap import freeze_startup_heap
from engine.remote.messages import (
    STATE_PERIOD_S,
    Address,
    Cancel,
    Closed,
    EngineSpec,
    Heartbeat,
    Ready,
    StartFailed,
    Stop,
    Stopped,
    Submit,
)
from engine.remote.pipe import read_into, send
from engine.remote.service import CoreService
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
    """Runs the core and its service (engine/remote/service.py): to the owner alone, or (with `listen`) to
    every server process that connects to the socket, the owner then only starting and stopping it."""

    def __init__(self, owner: Connection, spec: EngineSpec, listen: Address | None) -> None:
        self.owner = owner
        self.spec = spec
        self.listen = listen
        self.service: CoreService | None = None
        self.done: asyncio.Future[None] | None = None

    async def run(self) -> None:
        from engine.local import load_core  # the child alone loads the stages

        loop = asyncio.get_running_loop()
        try:
            source = ModelSource.open(self.spec.model, self.spec.profile.load_format, self.spec.cache_dir)
            core = load_core(source, self.spec.profile)
            await core.start()
        except Exception as e:
            log.exception("engine failed to start")
            send(self.owner, StartFailed(f"{type(e).__name__}: {e}"))
            return
        freeze_startup_heap()  # the process ends with it: nothing to thaw
        self.service = service = CoreService(core, self.spec, loop)
        self.done = loop.create_future()
        if self.listen is not None:  # listening before Ready: the owner lets server processes attach on it
            service.listen(*self.listen)
        send(self.owner, Ready(self.spec))
        if self.listen is None:
            service.join(self.owner, read=False)  # it submits and hears events; its messages come through here
        read_into(self.owner, loop, self._on_owner)
        while not self.done.done():
            service.beat()
            if self.listen is not None:  # a host's pipe hears from it too: its supervisor takes silence for a stall
                send(self.owner, Heartbeat())
            await asyncio.wait([self.done], timeout=STATE_PERIOD_S)
        service.close()
        await core.stop()  # ends every open request with Failed
        service.flush()
        send(self.owner, Stopped())

    def _on_owner(self, batch: list[Any]) -> None:
        """A Stop, or the owner gone (the parent died), stops the engine."""
        assert self.service is not None and self.done is not None
        if self.listen is None:
            self.service.on_messages(self.owner, [m for m in batch if isinstance(m, (Submit, Cancel))])
        if any(isinstance(m, (Stop, Closed)) for m in batch) and not self.done.done():
            self.done.set_result(None)
