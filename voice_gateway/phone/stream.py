"""WS /v1/phone/{carrier}/media, the carrier's media stream, and the sideband's way onto a live call
(WS /v1/realtime?call_id=...).

A stream is accepted, then must say `start` (after an optional `connected`) within `start_timeout_s`, naming a
call this server answered with that call's token; anything else closes it with 1008 before a session exists.
Then the call (`call.py`) runs until it ends, and gives everything back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import replace

from fastapi import APIRouter, WebSocket

from voice_gateway.admission import Refused
from voice_gateway.audio.g711 import G711_SAMPLE_RATE_HZ
from voice_gateway.phone.book import CallBook
from voice_gateway.phone.call import CLOSE_BAD_DATA, CLOSE_POLICY, CLOSE_TOO_BIG, PhoneCall
from voice_gateway.phone.config import PhoneConfig
from voice_gateway.phone.control import CALL_TOOLS, control_for
from voice_gateway.phone.dialects import DIALECTS, CarrierError, Connected, Dialect, Start, parse
from voice_gateway.phone.peers import FORWARDED
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.session import Session

log = logging.getLogger(__name__)
router = APIRouter()

CLOSE_TRY_AGAIN = 1013


class Refusal(Exception):
    """A stream refused before its call began: the close's `code` and `reason`."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason


@router.websocket("/v1/phone/{carrier}/media")
async def media(ws: WebSocket, carrier: str) -> None:
    state = ws.app.state
    cfg: PhoneConfig = state.phone
    book: CallBook = state.phone_calls
    dialect = DIALECTS.get(carrier)
    if dialect is None:
        await ws.close(code=CLOSE_POLICY, reason="no such carrier")
        return
    await ws.accept()
    try:
        start = await asyncio.wait_for(_await_start(ws, dialect, cfg), cfg.start_timeout_s)
        answered = book.claim(start.parameters.get("token"), start.call_id, carrier)
        if answered is None:
            raise Refusal(CLOSE_POLICY, f"call {start.call_id}: this server did not answer it, or the token is not "
                          "valid")
        try:
            slot = state.admission.acquire("phone")
        except Refused as refused:
            raise Refusal(CLOSE_TRY_AGAIN, f"call {start.call_id}: {refused.message}") from None
    except TimeoutError:
        log.warning("%s stream: no start within %.0f s; closing", carrier, cfg.start_timeout_s)
        await _close(ws, CLOSE_POLICY, "no start")
        return
    except Refusal as refusal:
        log.warning("%s stream refused: %s", carrier, refusal.reason)
        await _close(ws, refusal.code, refusal.reason)
        return
    session = Session(state.engine, state.gateway, ev.Dialect.GA, state.gateway_metrics, "phone",
                      audio_on_track=True, track_rate_hz=G711_SAMPLE_RATE_HZ)
    tools = _call_tools(cfg, answered.session)
    # a pressed key as a user item too: the app's accept says so for its call (`dtmf_items`), else the server
    call_cfg = replace(cfg, dtmf_items=bool(answered.session.get("dtmf_items", cfg.dtmf_items)))
    call = PhoneCall(ws, session, slot, dialect, start, call_cfg, tools, control_for(carrier, cfg), book)
    session.open()
    await session.handle(_call_settings(tools, answered.session))
    await call.run()


async def _await_start(ws: WebSocket, dialect: Dialect, cfg: PhoneConfig) -> Start:
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            raise Refusal(CLOSE_POLICY, "closed before start")
        raw = message.get("text") or message.get("bytes") or b""
        if len(raw) > cfg.max_frame_bytes:
            raise Refusal(CLOSE_TOO_BIG, "frame too large")
        try:
            msg = parse(dialect, raw)
        except CarrierError as e:
            raise Refusal(CLOSE_BAD_DATA, str(e)[:120]) from None
        if isinstance(msg, Start):
            return msg
        if not isinstance(msg, Connected):
            raise Refusal(CLOSE_POLICY, "media before start")


def _call_tools(cfg: PhoneConfig, accepted: dict) -> frozenset[str]:
    """The built-in call tools this call has: the server's, and those the app's accept names."""
    named = {str(t.get("name")) for t in accepted.get("tools", []) if isinstance(t, dict)}
    return frozenset(cfg.call_tools) | frozenset(named & CALL_TOOLS.keys())


def _call_settings(call_tools: frozenset[str], accepted: dict) -> ev.SessionUpdate:
    """The session a call starts with: what the app accepted it with, its built-in tools as this server defines
    them (an app names one to enable it) beside the app's own."""
    own = [t for t in accepted.get("tools", []) if not (isinstance(t, dict) and t.get("name") in CALL_TOOLS)]
    tools = [*(CALL_TOOLS[name].model_dump(exclude_none=True) for name in sorted(call_tools)), *own]
    session = {"type": "realtime", **accepted, "tools": tools}
    try:
        event = ev.parse_client_event(json.dumps({"type": "session.update", "session": session}))
    except ev.ProtocolError as e:
        # the app's accept was checked as JSON only: a session the protocol refuses leaves the profile's
        log.warning("the app's session for a call was refused (%s); the call keeps the profile's", e)
        event = ev.parse_client_event(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "tools": tools}}))
    assert isinstance(event, ev.SessionUpdate), event
    return event


async def _close(ws: WebSocket, code: int, reason: str) -> None:
    with contextlib.suppress(Exception):
        await ws.close(code=code, reason=reason[:120])


async def attach_sideband(ws: WebSocket, call_id: str) -> None:
    """The app's sideband: the key checked as the WebSocket's, then onto the live call `call_id`, or refused."""
    state = ws.app.state
    try:
        state.admission.check_key(ws.headers.get("authorization"), ws.scope.get("subprotocols", []))
    except Refused:
        await ws.close(code=CLOSE_POLICY, reason="invalid or missing API key")  # before accept: HTTP 403
        return
    book: CallBook = state.phone_calls
    if (holder := book.elsewhere(call_id)) is not None and FORWARDED not in ws.headers:
        assert book.peers is not None
        await book.peers.bridge(ws, holder)
        return
    call = book.live.get(call_id)
    if not isinstance(call, PhoneCall):
        log.info("sideband refused: no live call %s", call_id)
        await ws.close(code=CLOSE_POLICY, reason="no such call")
        return
    subprotocols = ws.scope.get("subprotocols", [])
    await ws.accept(subprotocol="realtime" if "realtime" in subprotocols else None)
    await call.attach(ws)
