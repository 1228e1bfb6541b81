"""A full server at capacity, on loopback: what a chat client and a realtime session are told, with the
engine in the server's process and in a process of its own (where the count is kept next to the stages)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets

from tests.conftest import Server, start_server, stop_server

# one reply at a time, no queue: while a spoken reply plays (seconds on a CPU), every other request is refused
ONE_AT_A_TIME = json.dumps({"thinker": {"max_batch": 1, "ignore_eos": True}, "talker": {"ignore_eos": True}})


@pytest.fixture(scope="module", params=["in_process", "process"])
def server(request: pytest.FixtureRequest, tiny_checkpoint: Path, cache_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    overrides = json.dumps({"admission": {"max_queued": 0}, "engine": {"where": request.param}})
    proc, srv = start_server(cache_dir, tmp_path_factory.mktemp("overload") / "server.log",
                             "--overrides", overrides, "--stage-overrides", ONE_AT_A_TIME)
    yield srv
    stop_server(proc)


def _chat(stream: bool, audio: bool = False) -> dict:
    body: dict = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4,
                  "stream": stream}
    if audio:
        body |= {"modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "pcm16"}}
    return body


def _assert_overloaded(resp: httpx.Response) -> None:
    assert resp.status_code == 429, resp.text
    assert int(resp.headers["retry-after"]) >= 1
    error = resp.json()["error"]
    assert error["code"] == "server_overloaded" and error["type"] == "server_error" and "capacity" in error["message"]


async def _realtime_reply(server: Server) -> dict:
    url = server.base_url.replace("http://", "ws://") + "/v1/realtime"
    async with websockets.connect(url, open_timeout=30) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}}))
        await ws.send(json.dumps({"type": "response.create"}))
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if event["type"] == "response.done":
                return event["response"]


async def test_a_full_server_refuses_with_429_and_retry_after_and_serves_again_once_free(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as client:
        async with client.stream("POST", "/v1/chat/completions", json=_chat(True, audio=True)) as running:
            assert running.status_code == 200
            lines = running.aiter_lines()
            assert (await anext(lines)).startswith("data: ")  # it holds the one place now
            async with client.stream("POST", "/v1/chat/completions", json=_chat(True)) as refused:
                await refused.aread()
                _assert_overloaded(refused)
            _assert_overloaded(await client.post("/v1/chat/completions", json=_chat(False)))
            response = await _realtime_reply(server)
            assert response["status"] == "failed", response
            assert response["status_details"]["error"]["code"] == "server_overloaded", response
            assert [line async for line in lines][-2:] == ["data: [DONE]", ""]  # the running reply was unharmed
        served = await client.post("/v1/chat/completions", json=_chat(False))
        assert served.status_code == 200, served.text
        metrics = (await client.get("/metrics")).text
    refused_total = next(line for line in metrics.splitlines()
                         if line.startswith('engine_admission_refused_total{reason="full"}'))
    assert float(refused_total.split()[-1]) >= 3
