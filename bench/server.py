"""A `python -m voice_gateway.cli serve` subprocess on a free loopback port, for one ladder row.

`ServerProcess` owns the child process and its log file: it starts the server with the
interpreter running the bench (so a source tree with PYTHONPATH=. works without an installed
entry point), waits for /health, and stops it with SIGINT (a clean lifespan shutdown), then
SIGKILL.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

# The directory that holds `bench` and, beside it, the `voice_gateway` and `engine` packages the
# server runs from (the repo root in a source tree). bench never imports them: it runs them.
_CODE_ROOT = Path(__file__).resolve().parents[1]
_LOG_TAIL_CHARS = 4000


class ServerStartError(RuntimeError):
    """The server exited or never answered /health; the message carries its log tail."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, serve_args: list[str], log_path: Path, cwd: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [sys.executable, "-m", "voice_gateway.cli", "serve", *serve_args,
                     "--host", "127.0.0.1", "--port", str(self.port)]
        self.log_path = log_path
        self.cwd = cwd or Path.cwd()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    def start(self, timeout_s: float, poll_s: float = 0.25) -> float:
        """Start and wait until /health answers 200; returns the seconds that took."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        path = os.pathsep.join(p for p in (str(_CODE_ROOT), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
        t0 = time.monotonic()
        with self.log_path.open("wb") as log_file:
            self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=env, stdout=log_file,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while True:
                if (rc := self.proc.poll()) is not None:
                    raise ServerStartError(f"server exited with code {rc} during start-up; log tail:\n"
                                           + self.log_tail())
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        return time.monotonic() - t0
                except httpx.HTTPError:
                    pass
                if time.monotonic() - t0 > timeout_s:
                    self.stop()
                    raise ServerStartError(f"no answer from {self.url}/health within {timeout_s:g} s; "
                                           "log tail:\n" + self.log_tail())
                time.sleep(poll_s)

    def exited(self) -> int | None:
        """The exit code if the server has died, else None."""
        return None if self.proc is None else self.proc.poll()

    def stop(self, timeout_s: float = 30.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGINT)  # uvicorn: graceful shutdown, the engine's stop() runs
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=timeout_s)

    def log_tail(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return text[-_LOG_TAIL_CHARS:]
