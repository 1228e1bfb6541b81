"""Shared fixtures: the tiny checkpoint (built once per session) and a real server on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch

# Without a GPU our Triton kernels run in Triton's CPU interpreter; it is chosen when a kernel
# module is imported, so before any test imports one.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from engine.omni.weights.tiny import ensure_tiny_checkpoint

REPO = Path(__file__).resolve().parent.parent

# The lanes (docs/testing.md): each test's markers follow from where it lives, so a new test file in a
# lane's folder or with a lane's name prefix is in that lane without a line of its own. `integration`: the
# test starts a server or another process of ours; `slow`: it runs alone for half a minute or more on two
# cores; the others name what the test needs besides. The fast lane (scripts/test.sh --fast) is tests/unit and
# tests/bench without `integration` and `slow`.
_MARKS_BY_FOLDER = {
    "integration": ("integration",),
    "reliability": ("integration",),
    "browser": ("integration", "browser"),
    "gpu": ("gpu",),
}
_MARKS_BY_FILE_PREFIX = {
    # unit tests of the engine in its own process, the app in a fresh interpreter, a server without aiortc
    "test_engine_process.py": ("integration",),
    "test_app_startup": ("integration",),
    "test_webrtc_extra": ("integration",),
    # tests/bench: these three run the bench against real servers (its other files mark such tests one by one)
    "test_bench_ladder": ("integration",),
    "test_bench_realtime": ("integration",),
    "test_bench_soak": ("integration",),
    # torch.compile's inductor on the CPU: 30-65 s for the one test
    "test_compiled_decode": ("slow",),
    "test_docker_image": ("docker",),
    "test_livekit_": ("frameworks",),
    "test_pipecat": ("frameworks",),
    "test_ray_": ("ray",),
}

# single tests of a faster file: the whole engine's kernels in Triton's CPU interpreter (test_triton_kernels.py
# checks each kernel in the fast lane)
_SLOW_TESTS = {"test_reference_equivalence.py::test_engine_equals_transformers_generate[cpu-triton-kernels]"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = REPO / "tests"
    for item in items:
        parts = item.path.relative_to(tests).parts if item.path.is_relative_to(tests) else ()
        names = [*_MARKS_BY_FOLDER.get(parts[0], ())] if len(parts) > 1 else []
        names += [m for prefix, marks in _MARKS_BY_FILE_PREFIX.items() if item.path.name.startswith(prefix)
                  for m in marks]
        if f"{item.path.name}::{item.name}" in _SLOW_TESTS:
            names.append("slow")
        for name in dict.fromkeys(names):
            item.add_marker(name)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vg-cache")


@pytest.fixture(scope="session")
def tiny_checkpoint(cache_dir: Path) -> Path:
    return ensure_tiny_checkpoint(cache_dir)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    base_url: str
    log_path: Path
    pid: int

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.base_url + path, timeout=10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_server(cache_dir: Path, log_path: Path, *extra: str, model: str = "tiny",
                 ready_s: float = 180) -> tuple[subprocess.Popen, Server]:
    port = free_port()
    cmd = [sys.executable, "-m", "voice_gateway.cli", "serve", model, "--port", str(port), "--cache-dir", str(cache_dir),
           *extra]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", log_path, proc.pid)
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()}")
        try:
            if server.get("/health").status_code == 200:
                return proc, server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server did not start:\n{server.log()}")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="session")
def server(tiny_checkpoint: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    proc, srv = start_server(cache_dir, tmp_path_factory.mktemp("server") / "server.log")
    yield srv
    stop_server(proc)
