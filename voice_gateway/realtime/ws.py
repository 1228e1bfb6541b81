"""WS /v1/realtime: the WebSocket transport for a realtime `Session` (frames in, outbox out)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from voice_gateway.realtime.events import dialect_for
from voice_gateway.realtime.session import Session

log = logging.getLogger(__name__)
router = APIRouter()

_SUBPROTOCOL_KEY_PREFIX = "openai-insecure-api-key."
CLOSE_POLICY, CLOSE_TRY_AGAIN = 1008, 1013


def offered_api_key(authorization: str | None, subprotocols: list[str]) -> str | None:
    """The key from `Authorization: Bearer` or, for browsers, the `openai-insecure-api-key.` subprotocol."""
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    for proto in subprotocols:
        if proto.startswith(_SUBPROTOCOL_KEY_PREFIX):
            return proto[len(_SUBPROTOCOL_KEY_PREFIX) :]
    return None


@router.websocket("/v1/realtime")
async def realtime(ws: WebSocket, model: str | None = None) -> None:
    state = ws.app.state
    gateway, engine, metrics = state.gateway, state.engine, state.gateway_metrics
    subprotocols = ws.scope.get("subprotocols", [])
    if gateway.api_key and offered_api_key(ws.headers.get("authorization"), subprotocols) != gateway.api_key:
        metrics.refused_sessions.labels("unauthorized").inc()
        await ws.close(code=CLOSE_POLICY, reason="invalid or missing API key")
        return
    # Browsers must see one of their offered subprotocols echoed back, or they drop the socket.
    chosen = next((p for p in subprotocols if p == "realtime"), subprotocols[0] if subprotocols else None)
    await ws.accept(subprotocol=chosen)
    session = Session(engine, gateway, dialect_for(ws.headers.get("openai-beta")), metrics, "websocket")
    if model is not None and model != engine.info.model_id:
        await _refuse(ws, session, "model_not_found", f"this server serves {engine.info.model_id!r}, not {model!r}")
        return
    if state.sessions >= gateway.max_sessions:
        metrics.refused_sessions.labels("too_many_sessions").inc()
        await _refuse(ws, session, "too_many_sessions", f"the server is at its limit of {gateway.max_sessions} sessions")
        return
    state.sessions += 1
    metrics.active_sessions.labels("websocket").inc()
    session.open()
    writer = asyncio.create_task(_write(ws, session))
    try:
        async with asyncio.timeout(gateway.max_session_s):
            await _read(ws, session)
    except TimeoutError:
        session.error("session_expired", f"sessions last at most {gateway.max_session_s:.0f} s")
    except WebSocketDisconnect:
        pass
    finally:
        state.sessions -= 1
        metrics.active_sessions.labels("websocket").dec()
        await session.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer, timeout=2)
        writer.cancel()
        with contextlib.suppress(Exception):
            await ws.close()


async def _read(ws: WebSocket, session: Session) -> None:
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        data = message.get("text")
        if data is None:
            data = message.get("bytes") or b""
        await session.handle(data)


async def _write(ws: WebSocket, session: Session) -> None:
    while (payload := await session.outbox.get()) is not None:
        if isinstance(payload, bytes):
            await ws.send_bytes(payload)
        else:
            await ws.send_text(payload)


async def _refuse(ws: WebSocket, session: Session, code: str, message: str) -> None:
    session.error(code, message)
    while (payload := session.outbox.get_nowait()) is not None:
        await ws.send_text(payload)  # type: ignore[arg-type]
    await ws.close(code=CLOSE_TRY_AGAIN if code == "too_many_sessions" else CLOSE_POLICY, reason=message[:120])
