"""WS /v1/realtime: the WebSocket transport for a realtime `Session` (frames in, outbox out)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from voice_gateway.admission import Caller, Refused
from voice_gateway.realtime.events import ErrorDetail, ErrorEvent, dialect_for, serialize
from voice_gateway.realtime.frames import deliver
from voice_gateway.realtime.session import Session

log = logging.getLogger(__name__)
router = APIRouter()

CLOSE_POLICY, CLOSE_INTERNAL_ERROR, CLOSE_TRY_AGAIN = 1008, 1011, 1013


@router.websocket("/v1/realtime")
async def realtime(ws: WebSocket, model: str | None = None, call_id: str | None = None) -> None:
    state = ws.app.state
    if call_id is not None:  # a sideband onto a live phone call's session (voice_gateway/phone/stream.py)
        await state.sideband(ws, call_id)
        return
    gateway, engine, metrics, admission = state.gateway, state.engine, state.gateway_metrics, state.admission
    subprotocols = ws.scope.get("subprotocols", [])
    try:
        slot = admission.admit("websocket", Caller.of(ws), model)
    except Refused as refused:
        if refused.code == "invalid_api_key":
            await ws.close(code=CLOSE_POLICY, reason="invalid or missing API key")  # before accept: HTTP 403
        else:
            metrics.protocol_errors.labels(refused.code).inc()
            await _refuse(ws, subprotocols, refused)
        return
    session = Session(engine, gateway, dialect_for(ws.headers.get("openai-beta")), metrics, "websocket",
                      timing=ws.query_params.get("timing") == "1")
    writer: asyncio.Task[None] | None = None
    try:
        await ws.accept(subprotocol=_chosen_subprotocol(subprotocols))
        session.open()
        writer = asyncio.create_task(_write(ws, session))
        async with asyncio.timeout(gateway.max_session_s):
            await _read(ws, session)
    except TimeoutError:
        session.error("session_expired", f"sessions last at most {gateway.max_session_s:.0f} s")
    except WebSocketDisconnect:
        pass
    finally:
        slot.release()
        await session.close()
        if writer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer, timeout=2)
            writer.cancel()
        with contextlib.suppress(Exception):
            await ws.close()


def _chosen_subprotocol(subprotocols: list[str]) -> str | None:
    # Browsers must see one of their offered subprotocols echoed back, or they drop the socket.
    return next((p for p in subprotocols if p == "realtime"), subprotocols[0] if subprotocols else None)


async def _read(ws: WebSocket, session: Session) -> None:
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        data = message.get("text")
        if data is None:
            data = message.get("bytes") or b""
        await deliver(session, data)


async def _write(ws: WebSocket, session: Session) -> None:
    try:
        while (payload := await session.outbox.get()) is not None:
            if isinstance(payload, bytes):
                await ws.send_bytes(payload)
            else:
                await ws.send_text(payload)
    except WebSocketDisconnect:
        pass
    except Exception:
        # a session that cannot send would go mute for good: close it where the client sees it
        log.exception("session %s: a send failed; closing with %d", session.id, CLOSE_INTERNAL_ERROR)
        with contextlib.suppress(Exception):
            await ws.close(code=CLOSE_INTERNAL_ERROR, reason="internal error")


async def _refuse(ws: WebSocket, subprotocols: list[str], refused: Refused) -> None:
    """Accept only to say why in an `error` event, then close: 1013 (try again later) when full, else 1008."""
    await ws.accept(subprotocol=_chosen_subprotocol(subprotocols))
    error = ErrorEvent(error=ErrorDetail(code=refused.code, message=refused.message, param=refused.param))
    await ws.send_text(serialize(error, dialect_for(ws.headers.get("openai-beta"))) or "")
    log.info("websocket refused (%s): %s", refused.code, refused.message)
    code = CLOSE_TRY_AGAIN if refused.code == "too_many_sessions" else CLOSE_POLICY
    await ws.close(code=code, reason=refused.message[:120])
