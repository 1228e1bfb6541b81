"""The edge against the web: which pages and Host names may open a realtime session, what the API key guards,
and how long a stopping server waits for clients that stopped reading."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from tests.conftest import Server, start_server, stop_server

FOREIGN = "http://evil.example"


def _ws_url(server: Server) -> str:
    return server.base_url.replace("http://", "ws://") + "/v1/realtime"


async def _first_event(url: str, **connect: object) -> tuple[dict, int | None]:
    """The first event a realtime socket gets, and its close code if the server closes it right after."""
    async with websockets.connect(url, open_timeout=30, **connect) as ws:  # type: ignore[arg-type]
        first = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if first["type"] == "session.created":
            return first, None
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 10)
        return first, ws.close_code


@pytest.mark.parametrize("origin", [None, "same"])
def test_a_websocket_without_origin_or_from_its_own_origin_is_let_in(server: Server, origin: str | None) -> None:
    headers = {} if origin is None else {"origin": server.base_url}
    first, _ = asyncio.run(_first_event(_ws_url(server), additional_headers=headers))
    assert first["type"] == "session.created", first


def test_a_websocket_from_a_foreign_origin_is_refused(server: Server) -> None:
    first, close_code = asyncio.run(_first_event(_ws_url(server), additional_headers={"origin": FOREIGN}))
    assert first["type"] == "error" and first["error"]["code"] == "origin_not_allowed", first
    assert close_code == 1008


def test_a_websocket_through_a_foreign_host_is_refused(server: Server) -> None:
    # a DNS-rebound name: the socket reaches loopback, the Host header names the attacker's domain
    port = urlsplit(server.base_url).port
    rebound = f"ws://rebound.evil.example:{port}/v1/realtime"
    first, close_code = asyncio.run(_first_event(rebound, host="127.0.0.1", port=port,
                                                 additional_headers={"origin": f"http://rebound.evil.example:{port}"}))
    assert first["type"] == "error" and first["error"]["code"] == "origin_not_allowed", first
    assert close_code == 1008


def test_a_webrtc_offer_from_a_foreign_origin_or_host_is_refused(server: Server) -> None:
    for headers in ({"origin": FOREIGN}, {"host": "rebound.evil.example"}):
        answer = httpx.post(server.base_url + "/v1/realtime/calls", content="v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n",
                            headers={"content-type": "application/sdp", **headers}, timeout=10)
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "origin_not_allowed", answer.text


@pytest.fixture(scope="module")
def keyed(tiny_checkpoint: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    proc, srv = start_server(cache_dir, tmp_path_factory.mktemp("keyed") / "server.log", "--api-key", "sekrit")
    yield srv
    stop_server(proc)


def test_allowed_origins_and_hosts_are_let_in(tiny_checkpoint: Path, cache_dir: Path, tmp_path: Path) -> None:
    proc, srv = start_server(cache_dir, tmp_path / "server.log", "--api-key", "sekrit",
                             "--allowed-origins", FOREIGN, "--allowed-hosts", "voice.example")
    try:
        port = urlsplit(srv.base_url).port
        key = ["openai-insecure-api-key.sekrit"]
        first, _ = asyncio.run(_first_event(_ws_url(srv), subprotocols=key, additional_headers={"origin": FOREIGN}))
        assert first["type"] == "session.created", first
        first, _ = asyncio.run(_first_event(f"ws://voice.example:{port}/v1/realtime", host="127.0.0.1", port=port,
                                            subprotocols=key))
        assert first["type"] == "session.created", first
    finally:
        stop_server(proc)


@pytest.mark.parametrize("path", ["/metrics", "/docs", "/redoc", "/openapi.json", "/v1/models"])
def test_a_keyed_server_wants_the_key_everywhere_but_health_and_the_demo(keyed: Server, path: str) -> None:
    without = httpx.get(keyed.base_url + path, timeout=10)
    assert without.status_code == 401 and without.json()["error"]["code"] == "invalid_api_key", without.text
    wrong = httpx.get(keyed.base_url + path, headers={"authorization": "Bearer sekrix"}, timeout=10)
    assert wrong.status_code == 401
    assert httpx.get(keyed.base_url + path, headers={"authorization": "Bearer sekrit"}, timeout=10).status_code == 200
    assert keyed.get("/health").status_code == 200
    assert keyed.get("/").status_code == 200 and "<html" in keyed.get("/").text.lower()


def test_public_metrics_opens_only_metrics(tiny_checkpoint: Path, cache_dir: Path, tmp_path: Path) -> None:
    proc, srv = start_server(cache_dir, tmp_path / "server.log", "--api-key", "sekrit", "--public-metrics")
    try:
        assert srv.get("/metrics").status_code == 200
        assert srv.get("/openapi.json").status_code == 401
        assert srv.get("/docs").status_code == 401
    finally:
        stop_server(proc)


def test_sigterm_with_a_stalled_reader_exits_within_the_deadline(tiny_checkpoint: Path, cache_dir: Path,
                                                                 tmp_path: Path) -> None:
    proc, srv = start_server(cache_dir, tmp_path / "server.log", "--shutdown-timeout", "2")
    url = urlsplit(srv.base_url)
    # a streamed reply with audio, asked for by a client that then never reads a byte of it
    body = json.dumps({"model": "tiny", "stream": True, "modalities": ["text", "audio"],
                       "audio": {"voice": "ethan", "format": "pcm16"}, "max_tokens": 900,
                       "messages": [{"role": "user", "content": "Tell me a very long story."}]}).encode()
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window it offers
    stalled.connect((url.hostname, url.port))
    stalled.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    try:
        time.sleep(1.0)
        # the reply is under way: the server has a request in the engine
        deadline = time.monotonic() + 30
        while srv.get("/health").json()["active_requests"] == 0:
            assert time.monotonic() < deadline, "the stalled request never reached the engine"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        try:
            proc.wait(timeout=2 + 8)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"still running {time.monotonic() - sent:.1f} s after SIGTERM:\n{srv.log()[-3000:]}")
    finally:
        stalled.close()
        if proc.poll() is None:
            proc.kill()
