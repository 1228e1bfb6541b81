"""`serve --http-workers 2`: /metrics sums both workers' gateway figures, whichever worker answers it,
and shows the engine process's families once."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Server, start_server, stop_server
from voice_gateway.app import WORKER_ENV

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me about the sea."}], "stream": True,
        "max_tokens": 4}


@pytest.fixture(scope="module")
def workers_server(tiny_checkpoint: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    proc, srv = start_server(cache_dir, tmp_path_factory.mktemp("metrics-workers") / "server.log", "--http-workers", "2")
    folders = {_shared_folder(pid) for pid in _worker_pids(srv)}
    assert len(folders) == 1 and all(f.is_dir() for f in folders), folders
    yield srv
    stop_server(proc)
    assert "Traceback" not in srv.log()
    assert not any(f.exists() for f in folders), f"the server left {folders} behind"


def _shared_folder(pid: int) -> Path:
    """Where a worker writes its figures: its parent names it in the worker's environment."""
    env = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)
    return Path(json.loads(env[WORKER_ENV])["metrics_dir"])


def _worker_pids(server: Server) -> set[int]:
    """The server processes, from their tagged log lines once both have attached to the engine."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pids = {int(p) for p in re.findall(r"\[http (\d+)\]: engine process attached", server.log())}
        if len(pids) == 2:
            return pids
        time.sleep(0.2)
    raise AssertionError(f"two workers did not attach:\n{server.log()[-3000:]}")


def _served_by(conn: http.client.HTTPConnection, server_port: int, workers: set[int]) -> int | None:
    """The worker holding the other end of `conn` (an accepted socket), from /proc."""
    assert conn.sock is not None
    client_port = conn.sock.getsockname()[1]
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == server_port and int(fields[2].rsplit(":", 1)[1], 16) == client_port:
                inode = fields[9]
    for pid in workers:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if fd.readlink().name == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    return None


def _connect_to(pid: int, workers: set[int], host: str, port: int) -> http.client.HTTPConnection:
    others = workers - {pid}
    for other in others:
        os.kill(other, signal.SIGSTOP)
    try:
        conn = http.client.HTTPConnection(host, port, timeout=60)
        _get(conn, "/health")
    finally:
        for other in others:
            os.kill(other, signal.SIGCONT)
    assert _served_by(conn, port, workers) == pid
    return conn


def _get(conn: http.client.HTTPConnection, path: str) -> str:
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read().decode()
    assert response.status == 200, body
    return body


def _chat(conn: http.client.HTTPConnection) -> bool:
    """One streamed chat reply on this connection; whether it carried text (what gateway_chat_ttft counts)."""
    conn.request("POST", "/v1/chat/completions", body=json.dumps(CHAT), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    body = response.read().decode()
    assert response.status == 200, body
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in body.splitlines()
              if line.startswith("data: {") and '"choices":[{' in line]
    return any(d.get("content") for d in deltas)


def _sample(text: str, name: str) -> float:
    (value,) = re.findall(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(value)


def test_metrics_sum_every_worker_and_show_the_engine_once(workers_server: Server) -> None:
    workers = _worker_pids(workers_server)
    host, port = workers_server.base_url.removeprefix("http://").split(":")
    by_worker: dict[int, http.client.HTTPConnection] = {}
    try:
        # the kernel hands a new connection to whichever worker accepts first: with the others stopped,
        # that is the one we want
        for pid in workers:
            by_worker[pid] = _connect_to(pid, workers, host, int(port))
        first, second = by_worker.values()
        on_first, on_second = sum(_chat(first) for _ in range(3)), sum(_chat(second) for _ in range(2))
        assert on_first and on_second, "a reply of the tiny model carried no text"
        with_text = on_first + on_second
        for conn in (first, second):  # both workers answer the same sums
            text = _get(conn, "/metrics")
            assert _sample(text, "gateway_chat_ttft_seconds_count") == with_text, text
            for family in ("engine_ttft_seconds", "engine_stage_batch_size", "engine_process_up",
                           "gateway_chat_ttft_seconds"):
                assert len(re.findall(rf"^# TYPE {family} ", text, re.MULTILINE)) == 1, (family, text)
            assert _sample(text, "engine_process_up") == 1
    finally:
        for conn in by_worker.values():
            conn.close()
