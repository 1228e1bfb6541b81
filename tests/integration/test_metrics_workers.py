"""`serve --http-workers 2`: /metrics sums both workers' gateway figures, whichever worker answers it,
and shows the engine process's families once."""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Server, start_server, stop_server
from tests.workers import connect_to, get, worker_pids
from voice_gateway.app import WORKER_ENV

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me about the sea."}], "stream": True,
        "max_tokens": 4}


@pytest.fixture(scope="module")
def workers_server(tiny_checkpoint: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    proc, srv = start_server(cache_dir, tmp_path_factory.mktemp("metrics-workers") / "server.log", "--http-workers", "2")
    folders = {_shared_folder(pid) for pid in worker_pids(srv, "engine process attached")}
    assert len(folders) == 1 and all(f.is_dir() for f in folders), folders
    yield srv
    stop_server(proc)
    assert "Traceback" not in srv.log()
    assert not any(f.exists() for f in folders), f"the server left {folders} behind"


def _shared_folder(pid: int) -> Path:
    """Where a worker writes its figures: its parent names it in the worker's environment."""
    env = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)
    return Path(json.loads(env[WORKER_ENV])["metrics_dir"])


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
    workers = worker_pids(workers_server, "engine process attached")
    host, port = workers_server.base_url.removeprefix("http://").split(":")
    by_worker: dict[int, http.client.HTTPConnection] = {}
    try:
        for pid in workers:
            by_worker[pid] = connect_to(pid, workers, host, int(port))
        first, second = by_worker.values()
        on_first, on_second = sum(_chat(first) for _ in range(3)), sum(_chat(second) for _ in range(2))
        assert on_first and on_second, "a reply of the tiny model carried no text"
        with_text = on_first + on_second
        for conn in (first, second):  # both workers answer the same sums
            text = get(conn, "/metrics")
            assert _sample(text, "gateway_chat_ttft_seconds_count") == with_text, text
            for family in ("engine_ttft_seconds", "engine_stage_batch_size", "engine_process_up",
                           "gateway_chat_ttft_seconds"):
                assert len(re.findall(rf"^# TYPE {family} ", text, re.MULTILINE)) == 1, (family, text)
            assert _sample(text, "engine_process_up") == 1
    finally:
        for conn in by_worker.values():
            conn.close()
