"""`EngineHost`: one engine process (engine/remote/child.py) that several server processes share, for
`serve --http-workers N`, each attached through `attach_engine(address)`."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
from pathlib import Path

from engine.profile import DeployProfile
from engine.remote.client import RemoteCore
from engine.remote.messages import Address, EngineSpec
from engine.remote.reach import SpawnChild

HOST_STOP_TIMEOUT_S = 90  # the child's own stop, then its reaping


class EngineHost:
    """Owns an engine child that serves several server processes at `address`, and a thread whose event loop keeps one
    serving there, supervised over the child's pipe as any engine in another process is. The server processes see a
    loss on their own connections, fail their requests, and connect again."""

    def __init__(self, model: str, profile: DeployProfile, cache_dir: Path | None = None) -> None:
        self.spec = EngineSpec(model, profile.in_one_process(), cache_dir)
        self.address: Address = (str(Path(tempfile.mkdtemp(prefix="vg-engine-")) / "engine.sock"), os.urandom(16))
        self._core = RemoteCore(SpawnChild(self.spec, self.address))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="engine-host", daemon=True)

    @property
    def pid(self) -> int | None:
        """The engine process serving now (or starting, or the last one)."""
        return self._core.pid

    def start(self) -> None:
        """Start the first child; EngineError if it does not get ready."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._core.start(), self._loop).result()

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._core.stop(), self._loop).result(HOST_STOP_TIMEOUT_S)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()
        shutil.rmtree(Path(self.address[0]).parent, ignore_errors=True)
