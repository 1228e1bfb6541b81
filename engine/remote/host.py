"""`EngineHost`: one engine process (engine/remote/child.py) that several server processes share, for
`serve --http-workers N`; each attaches to it through `attach_engine(address)`."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from engine.api import EngineError
from engine.remote.child import START_TIMEOUT_S, spawn_child
from engine.remote.messages import Address, EngineSpec, StartFailed, Stop
from engine.remote.pipe import send

log = logging.getLogger(__name__)


class EngineHost:
    """Owns an engine child that serves several server processes, each through `attach_engine(address)`.

    The owner's pipe carries only the start and the stop: nobody reads it in between."""

    def __init__(self, model: str, profile: Any, cache_dir: Path | None = None) -> None:
        self.spec = EngineSpec(model, profile, cache_dir)
        self.address: Address = (str(Path(tempfile.mkdtemp(prefix="vg-engine-")) / "engine.sock"), os.urandom(16))
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None

    def start(self) -> None:
        self._process, self._conn = spawn_child(self.spec, self.address)
        if not self._conn.poll(START_TIMEOUT_S):
            raise EngineError(f"the engine process did not start within {START_TIMEOUT_S} s")
        first = self._conn.recv()
        if isinstance(first, StartFailed):
            raise EngineError(f"the engine process failed to start: {first.reason}")
        log.info("engine process %d ready for server processes at %s", self._process.pid, self.address[0])

    def stop(self) -> None:
        if self._conn is not None and send(self._conn, Stop()):
            try:
                self._conn.poll(30)
            except OSError:
                pass
        if self._process is not None:
            self._process.join(10)
            if self._process.is_alive():
                self._process.kill()
        shutil.rmtree(Path(self.address[0]).parent, ignore_errors=True)
