"""How a `RemoteCore` (engine/remote/client.py) reaches an engine process on this host: `SpawnChild` starts
a child of its own (`engine.where: process`, and the one an `EngineHost` keeps at a socket), `AttachHost`
connects to the child an `EngineHost` keeps (`serve --http-workers N`). `handshake` reads any engine's
first word and `dial` connects to any engine's listening socket, for these and for a replica on Ray
(engine/replicas/replica.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from engine.api import EngineError
from engine.profile import SupervisionConfig
from engine.remote.child import START_TIMEOUT_S, spawn_child
from engine.remote.client import Reach
from engine.remote.messages import Address, EngineSpec, Ready, StartFailed
from engine.remote.pipe import cut, portable

log = logging.getLogger(__name__)

REAP_TIMEOUT_S = 10  # a child told to stop exits by then, or is killed
ATTACH_POLL_S = 0.2  # how often a server process looks for its starting engine's socket


def handshake(conn: Connection, what: str) -> EngineSpec:
    """Wait for the engine's Ready on `conn`: what it runs; EngineError if it failed, exited or timed out."""
    try:
        if not conn.poll(START_TIMEOUT_S):
            raise EngineError(f"{what} did not start within {START_TIMEOUT_S} s")
        first = conn.recv()
    except (EOFError, OSError) as e:
        raise EngineError(f"{what} exited while starting") from e
    if isinstance(first, StartFailed):
        raise EngineError(f"{what} failed to start: {first.reason}")
    assert isinstance(first, Ready), first
    return first.spec


def dial(address: Any, authkey: bytes, what: str, in_band: bool = False) -> tuple[Connection, EngineSpec]:
    """Connect to an engine's socket and read its Ready (blocking); `in_band`: an engine not our parent's child."""
    conn = Client(address, authkey=authkey)
    conn = portable(conn) if in_band else conn
    try:
        return conn, handshake(conn, what)
    except BaseException:
        cut(conn)
        raise


class SpawnChild(Reach):
    """Owns the engine child it started last; with `listen` the child also serves processes that attach there."""

    what = "the engine process"
    verb = "restart"
    recovery = "restarting it"
    owns_engine = True

    def __init__(self, spec: EngineSpec, listen: Address | None = None) -> None:
        self.spec = spec
        self.listen = listen
        self.pid: int | None = None
        self._process: BaseProcess | None = None  # until reaped

    async def open(self) -> tuple[Connection, EngineSpec]:
        if self.listen is not None:
            Path(self.listen[0]).unlink(missing_ok=True)  # a killed child leaves its socket file behind
        try:
            self._process, conn = spawn_child(self.spec, self.listen)
        except OSError as e:  # out of processes or descriptors: an attempt that failed, not the supervisor's end
            raise EngineError(f"cannot start the engine process: {e}") from e
        self.pid = self._process.pid
        self.ready = f"engine process {self.pid} ready"
        try:
            return conn, await asyncio.to_thread(handshake, conn, self.what)
        except BaseException:  # it failed, or the server stops while it starts: the killed child ends the wait
            self.lost(stalled=False)
            cut(conn)
            await self.reap()
            raise

    def lost(self, stalled: bool) -> None:
        if self._process is not None:
            self._process.kill()  # a stopped one too; a no-op on one that already exited

    async def reap(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        await asyncio.to_thread(process.join, REAP_TIMEOUT_S)
        if process.exitcode is None:
            process.kill()
            await asyncio.to_thread(process.join, REAP_TIMEOUT_S)
        log.info("engine process %d is gone (exit code %s)", process.pid, process.exitcode)

    def backoff_s(self, supervision: SupervisionConfig, attempts: int) -> float:
        return supervision.backoff_s(attempts)


class AttachHost(Reach):
    """Reaches the engine child an `EngineHost` keeps at `address`. A loss is the host's to repair (it starts
    the next child at the same address): this side only connects again, every `restart_backoff_s`."""

    what = "the engine process"
    recovery = "reconnecting"
    ready = "engine process attached"

    def __init__(self, address: Address) -> None:
        self.address = address
        self._attached = False

    async def open(self) -> tuple[Connection, EngineSpec]:
        if not self._attached:
            await self._started()
        try:
            reached = await asyncio.to_thread(dial, *self.address, self.what)
        except (OSError, EOFError, AuthenticationError) as e:  # e.g. its host is starting the next one
            raise EngineError(f"cannot reach the engine process: {type(e).__name__}: {e}") from e
        self._attached = True
        return reached

    async def _started(self) -> None:
        """Server processes start beside their engine: its socket appears once it is ready, and the socket's folder
        goes when its host gives up on it."""
        socket = Path(self.address[0])
        deadline = time.monotonic() + START_TIMEOUT_S
        while not socket.exists():
            if not socket.parent.exists():
                raise EngineError(f"{self.what} did not start")
            if time.monotonic() > deadline:
                raise EngineError(f"{self.what} did not start within {START_TIMEOUT_S} s")
            await asyncio.sleep(ATTACH_POLL_S)
