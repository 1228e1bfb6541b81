"""The app's hold on its calls: POST /v1/realtime/calls/{call_id}/accept|reject (a ringing call) and
/hangup|refer (a live one), as OpenAI's SIP calls are driven; the API key guards them like every /v1 route.
Behind several HTTP workers, a request for a call another worker holds is answered by that worker (peers.py)."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from voice_gateway.errors import APIError
from voice_gateway.phone.book import CallBook
from voice_gateway.phone.peers import FORWARDED

log = logging.getLogger(__name__)
router = APIRouter()


class Refer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target_uri: str  # tel:+15551234567, a number, or a sip: URI


def _book(request: Request) -> CallBook:
    return request.app.state.phone_calls


async def _elsewhere(request: Request, call_id: str) -> Response | None:
    """The holder's answer, where another worker holds the call (and is there to answer)."""
    book = _book(request)
    if FORWARDED in request.headers or (holder := book.elsewhere(call_id)) is None:
        return None
    assert book.peers is not None
    return await book.peers.forward(request, holder)


def _no_call(call_id: str) -> APIError:
    return APIError(404, f"no call {call_id!r} is ringing or live on this server", code="call_not_found",
                    param="call_id")


@router.post("/v1/realtime/calls/{call_id}/accept")
async def accept(request: Request, call_id: str) -> Response:
    if (answer := await _elsewhere(request, call_id)) is not None:
        return answer
    body = await request.body()
    session: dict[str, Any] = {}
    if body:
        try:
            session = json.loads(body)
        except ValueError:
            raise APIError(400, "the body is a session object (JSON)", code="invalid_json") from None
        if not isinstance(session, dict):
            raise APIError(400, "the body is a session object (JSON)", code="invalid_json")
    if not _book(request).decide(call_id, session):
        raise _no_call(call_id)
    log.info("call %s: accepted by the app", call_id)
    return Response(status_code=200)


@router.post("/v1/realtime/calls/{call_id}/reject")
async def reject(request: Request, call_id: str) -> Response:
    if (answer := await _elsewhere(request, call_id)) is not None:
        return answer
    if not _book(request).decide(call_id, None):
        raise _no_call(call_id)
    return Response(status_code=200)


@router.post("/v1/realtime/calls/{call_id}/hangup")
async def hangup(request: Request, call_id: str) -> Response:
    if (answer := await _elsewhere(request, call_id)) is not None:
        return answer
    book = _book(request)
    if book.decide(call_id, None):
        return Response(status_code=200)  # still ringing: rejected
    call = book.live.get(call_id)
    if call is None:
        raise _no_call(call_id)
    await call.hang_up("the app hung up")
    return Response(status_code=200)


@router.post("/v1/realtime/calls/{call_id}/refer")
async def refer(request: Request, call_id: str, body: Refer) -> Response:
    if (answer := await _elsewhere(request, call_id)) is not None:
        return answer
    call = _book(request).live.get(call_id)
    if call is None:
        raise _no_call(call_id)
    target = body.target_uri.removeprefix("tel:")
    try:
        await call.transfer(target)
    except NotImplementedError as e:
        raise APIError(501, str(e), type="server_error", code="transfer_not_supported") from None
    return Response(status_code=200)
