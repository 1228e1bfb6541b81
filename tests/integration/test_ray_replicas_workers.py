"""`serve --http-workers 2` with two tiny engine replicas on Ray: both server processes share the same two
replicas (not two each), route by the replicas' own load (a request on one worker avoids the replica
that the other worker keeps busy), /metrics shows each replica's figures once whichever worker answers,
and stopping the server leaves no replica process, nor any other process of its own."""

from __future__ import annotations

import http.client
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import start_server, stop_server
from tests.workers import connect_to, get, worker_pids

pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'voice-gateway[ray]')")

OVERRIDES = {"engine": {"where": "ray", "replicas": {"count": 2, "address": "local", "cpus": 1}},
             "stages": {"thinker": {"ignore_eos": True}}}
READY = r"engine replica (\d) ready \(process (\d+)\)"


def _chat(max_tokens: int, audio: bool = False) -> str:
    return json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "Tell me about the sea."}],
                       "stream": True, "max_tokens": max_tokens, "modalities": ["text", "audio"] if audio else ["text"]})


def _post_chat(conn: http.client.HTTPConnection, body: str) -> http.client.HTTPResponse:
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200, response.read()
    return response


def _finished(response: http.client.HTTPResponse) -> None:
    body = response.read().decode()
    assert "data: [DONE]" in body and '"finish_reason":"length"' in body, body[-2000:]


def _descendants(pid: int) -> set[int]:
    children = {pid: set[int]()}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), set()).add(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.add(child)
            todo.append(child)
    return found


def _metrics_of(pid: int, workers: set[int], host: str, port: int) -> str:
    """Worker `pid`'s /metrics, on a new connection: one idle past uvicorn's keep-alive is closed."""
    conn = connect_to(pid, workers, host, port)
    try:
        return get(conn, "/metrics")
    finally:
        conn.close()


def _completed(text: str) -> dict[str, list[float]]:
    """Replica -> each `engine_requests_total{outcome="completed"}` sample of it in a /metrics text."""
    out: dict[str, list[float]] = {}
    for replica, value in re.findall(r'^engine_requests_total\{outcome="completed",replica="(\d)"\} (\S+)$', text,
                                     re.MULTILINE):
        out.setdefault(replica, []).append(float(value))
    return out


@pytest.fixture(scope="module")
def started(tiny_checkpoint: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    proc, srv = start_server(cache_dir, tmp_path_factory.mktemp("replicas-workers") / "server.log",
                             "--http-workers", "2", "--overrides", json.dumps(OVERRIDES))
    try:
        yield proc, srv
    finally:
        stop_server(proc)


def test_two_workers_share_two_replicas(started: tuple) -> None:
    proc, server = started
    workers = worker_pids(server, "engine replica 1 ready")
    deadline = time.monotonic() + 60
    while len(found := set(re.findall(rf"\[http (\d+)\]: {READY}", server.log()))) < 4:
        assert time.monotonic() < deadline, server.log()[-3000:]
        time.sleep(0.2)
    # each worker found both replicas, and the same two processes
    assert {int(w) for w, _, _ in found} == workers, found
    replica_pids = {int(pid) for _, _, pid in found}
    assert len(replica_pids) == 2 and len({(i, pid) for _, i, pid in found}) == 2, found

    host, port = server.base_url.removeprefix("http://").split(":")
    first_pid, second_pid = sorted(workers)
    first = connect_to(first_pid, workers, host, int(port))
    second = connect_to(second_pid, workers, host, int(port))
    try:
        # a long reply through the first worker: both idle, so replica 0 runs it
        long = _post_chat(first, _chat(400, audio=True))
        assert long.readline().startswith(b"data: ")
        # the second worker hears from replica 0 that it is busy, so its request goes to replica 1
        deadline = time.monotonic() + 60
        while not sum(json.loads(get(second, "/health"))["stage_load"].values()):
            assert time.monotonic() < deadline, "the second worker never saw the first worker's request"
            time.sleep(0.05)
        _finished(_post_chat(second, _chat(4)))
        _finished(long)
        _finished(_post_chat(first, _chat(4)))

        # each replica's figures once in each worker's /metrics, the same in both, three requests in all
        deadline = time.monotonic() + 60
        while True:
            texts = [_metrics_of(pid, workers, host, int(port)) for pid in (first_pid, second_pid)]
            counts = [_completed(text) for text in texts]
            if all(sum(v[0] for v in c.values()) == 3 for c in counts):
                break
            assert time.monotonic() < deadline, counts
            time.sleep(0.2)
        assert counts[0] == counts[1], counts
        assert all(len(samples) == 1 for samples in counts[0].values()), counts
        assert counts[0]["1"] == [1.0], counts  # the second worker's first request, and only that
        for text in texts:
            assert len(re.findall(r"^# TYPE engine_requests_total ", text, re.MULTILINE)) == 1, text
            assert 'engine_replica_up{replica="0"} 1.0' in text and 'engine_replica_up{replica="1"} 1.0' in text
    finally:
        first.close()
        second.close()

    # stopping the server stops the replicas, Ray, and everything else it started
    own = _descendants(proc.pid)
    assert replica_pids <= own, (replica_pids, own)
    stop_server(proc)
    assert proc.returncode is not None
    deadline = time.monotonic() + 60
    while left := {pid for pid in own if os.path.exists(f"/proc/{pid}")}:
        assert time.monotonic() < deadline, f"processes left behind: {left}"
        time.sleep(0.2)
    assert "Traceback" not in server.log(), server.log()[-5000:]
