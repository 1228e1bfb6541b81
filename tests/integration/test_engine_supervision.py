"""A live server whose engine process is killed or stopped under it (`engine: process`, and
`--http-workers` behind an `EngineHost`): a reply under way ends with an `engine_unavailable` error,
/health says down with a 503 and new requests get a 503 (never a 400) until the engine is replaced,
then both serve again; the lost child is reaped."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from engine.profile import CONFIG_DIR
from tests.conftest import Server, start_server, stop_server

MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]
SUPERVISION = {"stall_timeout_s": 3, "restart_backoff_s": 0.5}  # short, so a test sees the whole cycle


def _server(cache_dir: Path, folder: Path, **profile_keys) -> tuple:
    profile = {**yaml.safe_load((CONFIG_DIR / "tiny.yaml").read_text()),
               "engine": {**profile_keys, "supervision": SUPERVISION}}
    (folder / "tiny.yaml").write_text(yaml.safe_dump(profile))
    return start_server(cache_dir, folder / "server.log", "--deploy-config", str(folder / "tiny.yaml"))


@pytest.fixture
def process_server(tiny_checkpoint: Path, cache_dir: Path, tmp_path: Path) -> Iterator[Server]:
    proc, srv = _server(cache_dir, tmp_path, where="process")
    yield srv
    stop_server(proc)
    assert "Traceback" not in srv.log()


@pytest.fixture
def workers_server(tiny_checkpoint: Path, cache_dir: Path, tmp_path: Path) -> Iterator[Server]:
    proc, srv = _server(cache_dir, tmp_path, http_workers=2)
    yield srv
    stop_server(proc)
    assert "Traceback" not in srv.log()


def _engine_pids(server: Server) -> list[int]:
    """Engine processes in the order they got ready, from the server's log."""
    return [int(pid) for pid in re.findall(r"engine process (\d+) ready", server.log())]


def _reaped(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


def _release(pid: int) -> None:
    """A test that failed may leave its child stopped: let it go."""
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _lose_mid_reply(server: Server, pid: int, sig: signal.Signals) -> tuple[list[str], float]:
    """Start a streamed reply, send the engine `sig` once audio flows, and read the stream to its end;
    returns its lines after the signal and the seconds they took."""
    body = {"model": "tiny", "messages": MESSAGES, "modalities": ["text", "audio"],
            "audio": {"voice": "ethan", "format": "pcm16"}, "stream": True, "max_tokens": 500}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", server.base_url + "/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            next(line for line in lines if '"data"' in line)
            os.kill(pid, sig)
            lost_at = time.monotonic()
            rest = [line for line in lines if line]
    return rest, time.monotonic() - lost_at


def _stream_error(lines: list[str]) -> dict:
    assert lines[-1] == "data: [DONE]", lines[-3:]
    errors = [json.loads(line[6:])["error"] for line in lines if line.startswith("data: {") and '"error"' in line]
    assert len(errors) == 1, lines[-3:]
    return errors[0]


def _until_health(server: Server, status: str, times: int = 1, timeout_s: float = 180) -> dict:
    """Poll /health until it says `status` `times` in a row (each answer may come from another worker)."""
    deadline, seen = time.monotonic() + timeout_s, 0
    while True:
        health = server.get("/health")
        seen = seen + 1 if health.json()["status"] == status else 0
        if seen == times:
            return health.json()
        assert time.monotonic() < deadline, health.json()
        time.sleep(0.1)


def _refused(server: Server) -> openai.APIStatusError:
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4)
    return refused.value


def _served(server: Server) -> str:
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0) as client:
        return client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4).choices[0].message.content


def test_a_killed_engine_process_is_a_503_until_it_is_restarted(process_server: Server) -> None:
    (pid,) = _engine_pids(process_server)
    try:
        rest, _ = _lose_mid_reply(process_server, pid, signal.SIGKILL)
        assert _stream_error(rest)["code"] == "engine_unavailable"

        health = process_server.get("/health")
        assert health.status_code == 503 and int(health.headers["Retry-After"]) >= 1
        assert health.json()["status"] == "down" and "exited" in health.json()["engine"]["detail"]
        assert health.json()["stage_load"] == {}  # the lost child's figures are not shown as if current
        refused = _refused(process_server)
        assert refused.status_code == 503 and refused.code == "engine_unavailable"
        assert int(refused.response.headers["Retry-After"]) >= 1

        health = _until_health(process_server, "ok")
        assert health["engine"] == {"detail": "", "restarts": 1}
        assert process_server.get("/health").status_code == 200
        assert _served(process_server)
        metrics = process_server.get("/metrics").text
        assert 'engine_process_restarts_total{cause="exited"} 1.0' in metrics and "engine_process_up 1.0" in metrics
        assert _reaped(pid) and len(_engine_pids(process_server)) == 2
    finally:
        _release(pid)


def test_a_stopped_engine_process_behind_workers_fails_by_the_deadline_and_is_replaced(workers_server: Server) -> None:
    (pid,) = _engine_pids(workers_server)
    try:
        rest, _ = _lose_mid_reply(workers_server, pid, signal.SIGSTOP)
        assert _stream_error(rest)["code"] == "engine_unavailable"
        # the child stays stopped until its supervisor kills it: an error at all is the deadline at work

        health = _until_health(workers_server, "down", timeout_s=30)
        assert health["engine"]["restarts"] == 0
        assert _refused(workers_server).status_code == 503

        _until_health(workers_server, "ok", times=6)  # both workers connected to the new child
        assert _served(workers_server)
        assert _reaped(pid) and len(_engine_pids(workers_server)) == 2
        assert "restart attempt 1" in workers_server.log()
    finally:
        _release(pid)


def test_a_server_stopped_with_its_engine_process_serves_on_when_both_resume(process_server: Server) -> None:
    """A paused container or VM stops the server and its engine alike: past `stall_timeout_s` of it the
    engine's beats wait unread, and the server must not take that for a stall and kill a healthy engine."""
    (pid,) = _engine_pids(process_server)
    try:
        for who in (process_server.pid, pid):
            os.kill(who, signal.SIGSTOP)
        time.sleep(SUPERVISION["stall_timeout_s"] + 2)
        for who in (pid, process_server.pid):
            os.kill(who, signal.SIGCONT)
        time.sleep(1)  # beats enough for a supervisor that had counted the pause to act on it

        health = _until_health(process_server, "ok", times=3)
        assert health["engine"] == {"detail": "", "restarts": 0}
        assert _served(process_server)
        assert _engine_pids(process_server) == [pid] and "stalled" not in process_server.log()
    finally:
        for who in (pid, process_server.pid):
            os.kill(who, signal.SIGCONT)  # a failed test's stopped processes go on, to stop in order


def test_a_restarted_engine_counts_its_load_from_zero(workers_server: Server) -> None:
    """The GPU profile's topology (the engine in its own process, HTTP workers in front): after a restart no stage
    counts a reply that is not running."""
    process_server = workers_server
    (pid,) = _engine_pids(process_server)
    try:
        _lose_mid_reply(process_server, pid, signal.SIGKILL)
        _until_health(process_server, "ok", times=4)
        # replies that speak, some of them left mid-stream as callers hang up
        body = {"model": "tiny", "messages": MESSAGES, "modalities": ["text", "audio"],
                "audio": {"voice": "ethan", "format": "pcm16"}, "stream": True, "max_tokens": 60}
        with httpx.Client(timeout=30) as http:
            for left_after in (1, 3, None, 2, None):
                with http.stream("POST", process_server.base_url + "/v1/chat/completions", json=body) as response:
                    for n, _ in enumerate(line for line in response.iter_lines() if '"data"' in line):
                        if n == left_after:
                            break
        deadline = time.monotonic() + 20
        while any((health := process_server.get("/health").json())["stage_load"].values()):
            assert time.monotonic() < deadline, health
            time.sleep(0.2)
        assert health["active_requests"] == 0
    finally:
        _release(pid)
