"""The calls of `serve --http-workers N`'s other server processes. A carrier's webhook, its media stream, the app's
accept and its sideband each reach whichever worker the kernel hands the connection to, so the workers share one
folder: an answered call's token is a file there until a stream claims it (only one can remove the file, so a
token still opens one stream), and each ringing or live call is a file that names the worker holding it. That worker
also serves on a socket of its own in the folder, where another worker forwards what it got for the call: the
app's accept, reject, hang-up and refer, and its sideband, bridged frame by frame."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import websockets
from fastapi import Request, WebSocket, WebSocketDisconnect
from fastapi.responses import Response
from websockets.asyncio.client import unix_connect

log = logging.getLogger(__name__)

FORWARDED = "x-voice-gateway-forwarded"  # one hop only: a worker never forwards what another forwarded to it
_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,64}")  # secrets.token_urlsafe's alphabet: only such names touch the folder
_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}


class Peers:
    """This worker's share of the folder `root`: the tokens it answered, the calls it holds, and its socket."""

    def __init__(self, root: Path, token_ttl_s: float, name: str | None = None) -> None:
        self.root = root
        self.token_ttl_s = token_ttl_s
        self.socket = root / f"{name or f'worker-{os.getpid()}'}.sock"
        (root / "tokens").mkdir(exist_ok=True)
        (root / "calls").mkdir(exist_ok=True)

    # tokens: what a stream's `start` must bring back
    def put_token(self, token: str, answered: dict[str, Any]) -> None:
        self._expire()
        _write(self.root / "tokens" / token, answered)

    def take_token(self, token: str | None, call_id: str, carrier: str) -> dict[str, Any] | None:
        """The answered call `token` names, if it is `call_id` on `carrier`, taken so that no other stream gets it;
        None if unknown, expired, or another call's."""
        if token is None or not _TOKEN.fullmatch(token):
            return None
        path = self.root / "tokens" / token
        try:
            answered = json.loads(path.read_text())
            fresh = time.time() - path.stat().st_mtime <= self.token_ttl_s
        except (FileNotFoundError, ValueError):
            return None
        if not fresh or answered.get("call_id") != call_id or answered.get("carrier") != carrier:
            return None
        try:
            path.unlink()  # the first stream to remove it has it
        except FileNotFoundError:
            return None
        return answered

    def _expire(self) -> None:
        now = time.time()
        for path in (self.root / "tokens").iterdir():
            with contextlib.suppress(FileNotFoundError):
                if now - path.stat().st_mtime > self.token_ttl_s:
                    path.unlink()

    # calls: which worker holds each
    def hold(self, call_id: str) -> None:
        _write(self._call(call_id), {"call_id": call_id, "socket": str(self.socket)})

    def release(self, call_id: str) -> None:
        if self.holder(call_id) is None:  # ours, or nobody's: a call that moved on is not another's to drop
            self._call(call_id).unlink(missing_ok=True)

    def holder(self, call_id: str) -> Path | None:
        """The socket of the worker holding `call_id`, where that is another worker; None where it is this one,
        or none."""
        try:
            held = json.loads(self._call(call_id).read_text())
        except (FileNotFoundError, ValueError):
            return None
        socket = Path(held["socket"])
        return None if socket == self.socket else socket

    def _call(self, call_id: str) -> Path:
        # carrier ids and the app's path parameters both name calls: hashed, neither can name another file
        return self.root / "calls" / hashlib.sha256(call_id.encode()).hexdigest()

    # forwarding to the holder
    async def forward(self, request: Request, to: Path) -> Response | None:
        """`request` as the holder at `to` answers it (its key, host and body as sent); None where the holder is
        gone."""
        headers = {k: v for k, v in request.headers.items() if k not in _HOP_HEADERS}
        headers[FORWARDED] = "1"
        url = httpx.URL(path=request.url.path, query=request.url.query.encode())
        async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(to)),
                                     base_url=f"http://{request.headers.get('host', 'localhost')}") as client:
            try:
                reply = await client.request(request.method, url, headers=headers, content=await request.body(),
                                             timeout=30)
            except httpx.TransportError as e:
                log.warning("%s: the worker holding the call is gone (%s)", request.url.path, e)
                return None
        kept = {k: v for k, v in reply.headers.items() if k not in _HOP_HEADERS | {"content-encoding"}}
        return Response(reply.content, status_code=reply.status_code, headers=kept)

    async def bridge(self, ws: WebSocket, to: Path) -> None:
        """`ws` (not yet accepted) joined to the same path on the holder at `to`, frame by frame both ways, until
        either side closes; the holder's refusal closes `ws` with its code."""
        headers = {k: v for k, v in ws.headers.items() if k in ("authorization", "origin", "user-agent")}
        headers[FORWARDED] = "1"
        offered = ws.scope.get("subprotocols", [])
        uri = f"ws://{ws.headers.get('host', 'localhost')}{ws.url.path}?{ws.url.query}"
        try:
            upstream = await unix_connect(str(to), uri, additional_headers=headers,
                                          subprotocols=offered or None, max_size=None)
        except (OSError, websockets.InvalidStatus, websockets.InvalidHandshake) as e:
            log.warning("sideband %s: the worker holding the call refused or is gone (%s)", ws.url.query, e)
            await ws.close(code=1008, reason="no such call")
            return
        await ws.accept(subprotocol=upstream.subprotocol)
        to_holder = asyncio.create_task(_to_holder(ws, upstream))
        try:
            async for frame in upstream:
                await (ws.send_text(frame) if isinstance(frame, str) else ws.send_bytes(frame))
        except websockets.ConnectionClosed:
            pass
        finally:
            to_holder.cancel()
            await asyncio.gather(to_holder, return_exceptions=True)
            await upstream.close()
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):
                await ws.close(code=upstream.close_code or 1000, reason=upstream.close_reason or "")

    @contextlib.asynccontextmanager
    async def serving(self, app: Any) -> AsyncIterator[None]:
        """This worker's own socket, serving `app` to the other workers, for as long as the context lasts."""
        # a sideband still bridged when the worker stops is cut after a few seconds, as the worker's own are
        server = _Beside(uvicorn.Config(app, uds=str(self.socket), lifespan="off", log_level="warning",
                                        ws_max_size=32 * 1024 * 1024, timeout_graceful_shutdown=5))
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if task.done():
            task.result()  # it failed to bind: say why
        try:
            yield
        finally:
            server.should_exit = True
            await task
            self.socket.unlink(missing_ok=True)


class _Beside(uvicorn.Server):
    """A second server in the worker's loop: the worker's own server keeps the signals (it stops this one)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


async def _to_holder(ws: WebSocket, upstream: Any) -> None:
    with contextlib.suppress(WebSocketDisconnect, websockets.ConnectionClosed):
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                break
            await upstream.send(message["text"] if message.get("text") is not None else message["bytes"])
    await upstream.close()


def _write(path: Path, body: dict[str, Any]) -> None:
    """`body` at `path`, whole or not at all, for a reader in another process."""
    part = path.with_name(f".{path.name}.{os.getpid()}")
    part.write_text(json.dumps(body))
    part.rename(path)
