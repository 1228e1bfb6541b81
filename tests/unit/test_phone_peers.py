"""Two HTTP workers' share of their calls (voice_gateway/phone/peers.py), in one process: each worker is a real app
serving on its own Unix socket in the shared folder, and each request for a call goes to the worker that does not
hold it, as the kernel may hand it over. The app is the phone's own routes on a stand-in call (the phone's media
and sessions are tests/integration/test_phone.py's)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import websockets
from fastapi import FastAPI, WebSocket
from websockets.asyncio.client import unix_connect

from voice_gateway.errors import install_error_handlers
from voice_gateway.phone import CallBook, control_router
from voice_gateway.phone.peers import FORWARDED, Peers

pytestmark = pytest.mark.asyncio


@dataclass
class StandInCall:
    """A live call as the routes see it: what it was told."""

    call_id: str
    told: list[str] = field(default_factory=list)

    async def hang_up(self, reason: str) -> None:
        self.told.append(f"hang up: {reason}")

    async def transfer(self, target: str) -> None:
        self.told.append(f"transfer: {target}")


def _worker(folder: Path, name: str, ttl_s: float = 60) -> FastAPI:
    book = CallBook(ttl_s, Peers(folder, ttl_s, name=name))
    app = FastAPI()
    app.state.phone_calls = book
    install_error_handlers(app)
    app.include_router(control_router)

    @app.websocket("/v1/realtime")
    async def sideband(ws: WebSocket, call_id: str) -> None:
        """The sideband's path as the holder serves it: here it says who it is, then echoes."""
        if (holder := book.elsewhere(call_id)) is not None and FORWARDED not in ws.headers:
            assert book.peers is not None
            await book.peers.bridge(ws, holder)
            return
        if call_id not in book.live:
            await ws.close(code=1008, reason="no such call")
            return
        await ws.accept(subprotocol="realtime")
        await ws.send_text(json.dumps({"from": name, "auth": ws.headers.get("authorization")}))
        async for text in ws.iter_text():
            await ws.send_text(f"{name} heard {text}")
        await ws.close(code=1000, reason="the call ended")

    return app


@contextlib.asynccontextmanager
async def _serving(*apps: FastAPI) -> AsyncIterator[None]:
    async with contextlib.AsyncExitStack() as stack:
        for app in apps:
            await stack.enter_async_context(app.state.phone_calls.peers.serving(app))
        yield


def _client(app: FastAPI) -> httpx.AsyncClient:
    socket = str(app.state.phone_calls.peers.socket)
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=socket), base_url="http://gateway.test")


async def test_a_token_answered_by_one_worker_opens_one_stream_on_any(tmp_path: Path) -> None:
    a, b = CallBook(60, Peers(tmp_path, 60, name="a")), CallBook(60, Peers(tmp_path, 60, name="b"))
    answered = a.answer("CA1", "twilio", {"instructions": "Be brief."})
    assert b.claim(answered.token, "CA2", "twilio") is None  # another call's stream
    assert b.claim(answered.token, "CA1", "telnyx") is None
    claimed = b.claim(answered.token, "CA1", "twilio")
    assert claimed is not None and claimed.session == {"instructions": "Be brief."}
    assert a.claim(answered.token, "CA1", "twilio") is None and b.claim(answered.token, "CA1", "twilio") is None
    for token in (None, "", "../../etc/passwd", "x" * 200):
        assert b.claim(token, "CA1", "twilio") is None


async def test_a_token_past_its_time_opens_nothing(tmp_path: Path) -> None:
    a, b = CallBook(60, Peers(tmp_path, 60, name="a")), CallBook(60, Peers(tmp_path, 60, name="b"))
    answered = a.answer("CA1", "twilio")
    old = time.time() - 61
    os.utime(tmp_path / "tokens" / answered.token, (old, old))
    assert b.claim(answered.token, "CA1", "twilio") is None
    a.answer("CA2", "twilio")  # each answer clears what expired
    assert [p.name for p in (tmp_path / "tokens").iterdir()] != [] and not (tmp_path / "tokens" / answered.token).exists()


async def test_the_apps_accept_reaches_the_worker_where_the_call_rings(tmp_path: Path) -> None:
    a, b = _worker(tmp_path, "a"), _worker(tmp_path, "b")
    async with _serving(a, b), _client(b) as to_b:
        with a.state.phone_calls.ringing("CA1") as decided:
            reply = await to_b.post("/v1/realtime/calls/CA1/accept", json={"instructions": "Hi."})
            assert reply.status_code == 200, reply.text
            assert await asyncio.wait_for(decided, 5) == {"instructions": "Hi."}
        with a.state.phone_calls.ringing("CA2") as decided:
            assert (await to_b.post("/v1/realtime/calls/CA2/reject")).status_code == 200
            assert await asyncio.wait_for(decided, 5) is None
        gone = await to_b.post("/v1/realtime/calls/CA1/accept", json={})
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "call_not_found"  # it rang no more


async def test_hang_up_and_refer_reach_the_worker_holding_the_call(tmp_path: Path) -> None:
    a, b = _worker(tmp_path, "a"), _worker(tmp_path, "b")
    call = StandInCall("CA1")
    a.state.phone_calls.go_live(call)
    async with _serving(a, b), _client(b) as to_b:
        assert (await to_b.post("/v1/realtime/calls/CA1/refer", json={"target_uri": "tel:+15551234567"})).status_code == 200
        assert (await to_b.post("/v1/realtime/calls/CA1/hangup")).status_code == 200
        bad = await to_b.post("/v1/realtime/calls/CA1/refer", json={"target": "+1555"})
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
        a.state.phone_calls.gone("CA1")
        after = await to_b.post("/v1/realtime/calls/CA1/hangup")
    assert call.told == ["transfer: +15551234567", "hang up: the app hung up"]
    assert after.status_code == 404
    assert not list((tmp_path / "calls").iterdir())


async def test_a_sideband_on_another_worker_is_bridged_to_the_call_both_ways(tmp_path: Path) -> None:
    a, b = _worker(tmp_path, "a"), _worker(tmp_path, "b")
    a.state.phone_calls.go_live(StandInCall("CA1"))
    async with _serving(a, b):
        sock = str(b.state.phone_calls.peers.socket)
        async with unix_connect(sock, "ws://gateway.test/v1/realtime?call_id=CA1", subprotocols=["realtime"],
                                additional_headers={"authorization": "Bearer k"}) as ws:
            assert ws.subprotocol == "realtime"
            assert json.loads(await ws.recv()) == {"from": "a", "auth": "Bearer k"}
            await ws.send("hello")
            assert await ws.recv() == "a heard hello"
        with pytest.raises(websockets.InvalidStatus):  # no call: refused before the handshake, as on one worker
            await unix_connect(sock, "ws://gateway.test/v1/realtime?call_id=CA9")
        a.state.phone_calls.gone("CA1")
        a.state.phone_calls.go_live(StandInCall("CA2"))
        a.state.phone_calls.peers.socket.unlink()  # a holder whose socket is gone: a refusal, not a hang
        with pytest.raises(websockets.InvalidStatus):
            await unix_connect(sock, "ws://gateway.test/v1/realtime?call_id=CA2")


async def test_a_request_for_a_call_whose_worker_is_gone_is_not_found(tmp_path: Path) -> None:
    a, b = _worker(tmp_path, "a"), _worker(tmp_path, "b")
    a.state.phone_calls.go_live(StandInCall("CA1"))
    async with _serving(b), _client(b) as to_b:  # a's socket never opened: as after its process died
        reply = await to_b.post("/v1/realtime/calls/CA1/hangup")
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "call_not_found", reply.text
