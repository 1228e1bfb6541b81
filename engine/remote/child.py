"""The engine's process: the core runs here, serving the pipe of the server process that started it and, for
`serve --http-workers N`, any number of server processes that attach over a Unix socket.

In one process the server's event loop shares the GIL with the stage threads: each time the loop gives it up
(each socket read and write, each wait) it waits behind a stage thread running Python, which delays requests'
starts and audio's bytes. Here the stages run in a child with a GIL of their own; the server's process keeps
HTTP, JSON, base64 and admission. With `EngineHost` each server process gets its own connection, and one that
goes away loses only its own requests. If the owner's pipe closes (the parent died), the child stops."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import signal
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from engine.backends import backend_for
from engine.remote.heap import freeze_startup_heap
from engine.remote.messages import (
    Address,
    Cancel,
    Closed,
    EngineSpec,
    Ready,
    StartFailed,
    Stop,
    Stopped,
    Submit,
)
from engine.remote.pipe import read_into, send
from engine.remote.service import CoreService

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
        asyncio.run(_serve(conn, spec, listen))
    finally:
        conn.close()


async def _serve(owner: Connection, spec: EngineSpec, listen: Address | None) -> None:
    """Serve the core to the owner and (with `listen`) every server process that connects, until the owner goes."""
    loop = asyncio.get_running_loop()
    try:
        core = backend_for(spec.model, spec.profile, spec.cache_dir).load_core()  # the child alone loads the stages
        await core.start()
    except Exception as e:
        log.exception("engine failed to start")
        send(owner, StartFailed(f"{type(e).__name__}: {e}"))
        return
    freeze_startup_heap()  # the process ends with it: nothing to thaw
    service = CoreService(core, spec, loop)
    done: asyncio.Future[None] = loop.create_future()
    if listen is not None:  # listening before Ready: the owner lets server processes attach on it
        service.listen(*listen)
    send(owner, Ready(spec))
    # the owner hears the core's state every beat, as every connection does: its supervisor takes silence for
    # a stall; its messages come through here
    service.join(owner, read=False)

    def on_owner(batch: list[Any]) -> None:
        service.on_messages(owner, [m for m in batch if isinstance(m, (Submit, Cancel))])
        if any(isinstance(m, (Stop, Closed)) for m in batch) and not done.done():
            done.set_result(None)

    read_into(owner, loop, on_owner)
    await done
    await service.stop()
    send(owner, Stopped())
