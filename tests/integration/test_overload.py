"""A full server at capacity, on loopback: what a chat client and a realtime session are told, with the
engine in the server's process and in a process of its own (where the count is kept next to the stages, and a
request's mark as a live turn crosses with it)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets

from tests.conftest import Server, start_server, stop_server
from tests.integration.test_realtime import client_for, events_until

# one reply at a time, no queue: while a spoken reply plays (seconds on a CPU), every other request is refused
ONE_AT_A_TIME = json.dumps({"thinker": {"max_batch": 1, "ignore_eos": True}, "talker": {"ignore_eos": True}})


def _one_at_a_time(cache_dir: Path, folder: Path, where: str, admission: dict) -> Iterator[Server]:
    """A server of one reply at a time, its engine `where`, under `admission`."""
    overrides = json.dumps({"admission": admission, "engine": {"where": where}})
    proc, srv = start_server(cache_dir, folder / "server.log", "--overrides", overrides,
                             "--stage-overrides", ONE_AT_A_TIME)
    yield srv
    stop_server(proc)


@pytest.fixture(scope="module", params=["in_process", "process"])
def server(request: pytest.FixtureRequest, tiny_checkpoint: Path, cache_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _one_at_a_time(cache_dir, tmp_path_factory.mktemp("overload"), request.param, {"max_queued": 0})


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


@pytest.fixture(scope="module", params=["in_process", "process"])
def live_server(request: pytest.FixtureRequest, tiny_checkpoint: Path, cache_dir: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # the default queue (64, 0.1 s) for others; a generous live bound, as a spoken reply on a CPU takes seconds
    yield from _one_at_a_time(cache_dir, tmp_path_factory.mktemp("live"), request.param, {"live_queue_timeout_s": 60})


async def _text_turn(client) -> str:
    """A realtime session's turn, answered in text (a few tokens) so that the queued turns run quickly."""
    async with client.realtime.connect(model="tiny") as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "hello"}]})
        await conn.response.create(response={"output_modalities": ["text"], "max_output_tokens": 4})
        response = (await events_until(conn, "response.done", timeout_s=120))[-1].response
    assert response.status == "completed", response.status_details
    return response.status


def _metric(text: str, name: str) -> float:
    return float(next(line for line in text.splitlines() if line.startswith(name)).split()[-1])


async def test_live_turns_wait_for_the_one_place_while_a_chat_request_past_it_is_refused_at_once(
        live_server: Server) -> None:
    turns = 3
    async with httpx.AsyncClient(base_url=live_server.base_url, timeout=120) as http, \
            client_for(live_server) as client:
        async with http.stream("POST", "/v1/chat/completions", json=_chat(True, audio=True)) as running:
            lines = running.aiter_lines()
            assert (await anext(lines)).startswith("data: ")  # it holds the one place for seconds
            waiting = [asyncio.create_task(_text_turn(client)) for _ in range(turns)]
            async with asyncio.timeout(30):
                while (await http.get("/health")).json()["active_requests"] < 1 + turns:
                    await asyncio.sleep(0.05)
            asked = time.monotonic()
            refused = await http.post("/v1/chat/completions", json=_chat(False))
            _assert_overloaded(refused)
            assert time.monotonic() - asked < 5, "the plain request waited past its 0.1 s"
            assert "no place for this request within 0.1 s" in refused.json()["error"]["message"]
            assert [line async for line in lines][-2:] == ["data: [DONE]", ""]
        assert await asyncio.wait_for(asyncio.gather(*waiting), 120) == ["completed"] * turns
        async with asyncio.timeout(10):  # an engine process reports its metrics every 0.25 s
            while _metric(metrics := (await http.get("/metrics")).text, "engine_admission_wait_seconds_count") < turns:
                await asyncio.sleep(0.1)
    # the turns waited for the spoken reply's place, past the 0.1 s that refused the chat request
    assert _metric(metrics, 'engine_admission_wait_seconds_bucket{le="0.1"}') < turns
    assert _metric(metrics, 'engine_admission_refused_total{reason="timeout"}') == 1
