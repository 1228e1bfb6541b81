"""`EngineHost`: one engine process (engine/remote/child.py) that several server processes share, for
`serve --http-workers N`, each attached through `attach_engine(address)`; and its supervision."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from engine.api import EngineError
from engine.remote.child import START_TIMEOUT_S, spawn_child
from engine.remote.messages import STATE_PERIOD_S, Address, EngineSpec, Ready, StartFailed, Stop, Stopped
from engine.remote.pipe import send
from engine.remote.silence import Silence

log = logging.getLogger(__name__)


class EngineHost:
    """Owns an engine child that serves several server processes, each through `attach_engine(address)`,
    and keeps one serving at that address.

    After `start()` a thread owns the child. It reads the owner's pipe, on which the child beats every
    `STATE_PERIOD_S`; when the child exits, or stays silent for `supervision.stall_timeout_s`, the thread
    kills it (a stopped one too), reaps it, and starts another at the same address and key after waits
    that double from one failed attempt to the next (`supervision.backoff_s`). The server processes see
    the loss on their own connections, fail their requests, and connect again (engine/remote/client.py)."""

    def __init__(self, model: str, profile: Any, cache_dir: Path | None = None) -> None:
        self.spec = EngineSpec(model, profile, cache_dir)
        self.address: Address = (str(Path(tempfile.mkdtemp(prefix="vg-engine-")) / "engine.sock"), os.urandom(16))
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        """The engine process serving now (or starting)."""
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        """Start the first child; EngineError if it does not get ready."""
        self._spawn()
        self._supervisor = threading.Thread(target=self._supervise, name="engine-host", daemon=True)
        self._supervisor.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join(60)  # it stops the child
        else:
            self._halt()  # the start failed: nobody supervises
        shutil.rmtree(Path(self.address[0]).parent, ignore_errors=True)

    def _spawn(self) -> None:
        """Start a child at the address and wait for its Ready; EngineError if it does not come."""
        Path(self.address[0]).unlink(missing_ok=True)  # a killed child leaves its socket file behind
        try:
            self._process, self._conn = spawn_child(self.spec, self.address)
        except OSError as e:  # out of processes or descriptors: an attempt that failed, not the thread's end
            raise EngineError(f"cannot start the engine process: {e}") from e
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while not self._conn.poll(STATE_PERIOD_S):  # in slices: a stop need not wait for a start
                if self._stopping.is_set():
                    raise EngineError("the server is shutting down")
                if time.monotonic() > deadline:
                    raise EngineError(f"the engine process did not start within {START_TIMEOUT_S} s")
            first = self._conn.recv()
        except (EOFError, OSError):
            raise EngineError("the engine process exited while starting") from None
        if isinstance(first, StartFailed):
            raise EngineError(f"the engine process failed to start: {first.reason}")
        assert isinstance(first, Ready), first
        log.info("engine process %d ready for server processes at %s", self._process.pid, self.address[0])

    def _supervise(self) -> None:
        cfg = self.spec.profile.supervision
        attempts, serving_since = 0, time.monotonic()
        while True:
            lost = self._watch(cfg.stall_timeout_s)
            if lost is None:
                self._halt()
                return
            log.error("engine process %s %s: the server processes fail what they had on it", self.pid, lost)
            self._kill()
            if time.monotonic() - serving_since > cfg.restart_backoff_max_s:
                attempts = 0  # it had served a good while: this loss begins a new run of restarts
            while True:
                wait_s = cfg.backoff_s(attempts)
                attempts += 1
                log.warning("engine process: restart attempt %d in %.1f s", attempts, wait_s)
                if self._stopping.wait(wait_s):
                    return
                try:
                    self._spawn()
                    break
                except EngineError as e:
                    log.error("engine process: restart attempt %d failed: %s", attempts, e)
                    self._kill()
                    if self._stopping.is_set():
                        return
            serving_since = time.monotonic()
            log.warning("engine process: serving again after restart attempt %d", attempts)

    def _watch(self, stall_timeout_s: float) -> str | None:
        """Read the owner's pipe until the child is lost (says how) or the host stops (None)."""
        assert self._conn is not None
        silence = Silence()
        while not self._stopping.is_set():
            try:
                if self._conn.poll(STATE_PERIOD_S):
                    self._conn.recv()  # a Heartbeat: it is there
                    silence.heard()
            except (EOFError, OSError):
                return "exited"
            if (silent_s := silence.look()) > stall_timeout_s:
                return f"stalled: no word from it for {silent_s:.1f} s"
        return None

    def _kill(self) -> None:
        """Kill the child (a stopped one too) and reap it, so no zombie is left; close its pipe."""
        if self._process is not None:
            self._process.kill()  # a no-op on one that already exited
            self._process.join(10)
            log.info("engine process %d is gone (exit code %s)", self._process.pid, self._process.exitcode)
        if self._conn is not None:
            self._conn.close()

    def _halt(self) -> None:
        """Stop the child: its core fails what it still holds, then it exits."""
        if self._conn is not None and send(self._conn, Stop()):
            deadline = time.monotonic() + 30
            try:
                while (left_s := deadline - time.monotonic()) > 0 and self._conn.poll(left_s):
                    if isinstance(self._conn.recv(), Stopped):
                        break
            except (EOFError, OSError):
                pass
        if self._process is not None:
            self._process.join(10)
        self._kill()  # what did not stop in time
