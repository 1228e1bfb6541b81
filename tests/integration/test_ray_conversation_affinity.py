"""`serve --http-workers 2` with two tiny engine replicas on Ray: a chat client that names its conversation
(`prompt_cache_key`) reaches the replica that keeps its prefix whichever server process takes its next
turn; one that does not name it lands where the load sends it, and prefills the whole history again."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.replicas.affinity import rendezvous
from tests.conftest import Server, start_server, stop_server
from tests.workers import connect_to, worker_pids

pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'voice-gateway[ray]')")

OVERRIDES = {"engine": {"where": "ray", "replicas": {"count": 2, "address": "local", "cpus": 1}},
             "stages": {"thinker": {"ignore_eos": True}}}
# long enough for the prefix cache to keep (64 tokens at least)
QUESTION = "Tell me about the sea, the ships that sail on it and the people who sail them. " * 4


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    proc, srv = start_server(cache_dir, tmp_path_factory.mktemp("affinity") / "server.log",
                             "--http-workers", "2", "--overrides", json.dumps(OVERRIDES))
    yield srv
    stop_server(proc)


def _chat(conn: http.client.HTTPConnection, messages: list[dict[str, str]], key: str | None) -> dict[str, Any]:
    body = {"model": "tiny", "messages": messages, "max_tokens": 4, "modalities": ["text"],
            **({"prompt_cache_key": key} if key else {})}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    reply = json.loads(response.read())
    assert response.status == 200, reply
    return reply


def _two_turns(first: http.client.HTTPConnection, second: http.client.HTTPConnection, key: str,
               name_the_second: bool) -> int:
    """Turn 1 through the first worker, turn 2 (its history and more) through the second: turn 2's cached tokens."""
    history = [{"role": "user", "content": f"[{key}] {QUESTION}"}]
    reply = _chat(first, history, key)
    history += [{"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                {"role": "user", "content": "And what about the wind?"}]
    again = _chat(second, history, key if name_the_second else None)
    return again["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_a_named_conversation_reaches_its_replica_through_either_worker(server: Server) -> None:
    workers = worker_pids(server, "engine replica 1 ready")
    host, port = server.base_url.removeprefix("http://").split(":")
    first_pid, second_pid = sorted(workers)
    first = connect_to(first_pid, workers, host, int(port))
    second = connect_to(second_pid, workers, host, int(port))
    # names that hash to replica 1: with both idle, load alone would send every request to replica 0
    named, unnamed = [key for key in (f"call-{i}" for i in range(100)) if rendezvous(key, [0, 1]) == 1][:2]
    try:
        assert _two_turns(first, second, named, name_the_second=True) > 64
        # the same path without the name on turn 2: the second worker knows nothing of turn 1
        assert _two_turns(first, second, unnamed, name_the_second=False) == 0
    finally:
        first.close()
        second.close()
