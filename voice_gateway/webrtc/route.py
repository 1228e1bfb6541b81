"""POST /v1/realtime/calls: a realtime session over WebRTC, where the `[webrtc]` extra (aiortc) is installed.

The call itself is `call.py`. Without aiortc the route stays and answers 501 in OpenAI's error shape,
naming the extra to install: the server (chat, the WebSocket, Opus over it) runs without it, and the demo
page, told so, talks over the WebSocket.
"""

from __future__ import annotations

import logging
from types import ModuleType

from fastapi import APIRouter, Request
from fastapi.responses import Response

from voice_gateway.admission import Caller, Refused
from voice_gateway.errors import APIError

log = logging.getLogger(__name__)
router = APIRouter()

call: ModuleType | None
try:
    from voice_gateway.webrtc import call
except ImportError as e:  # aiortc (or what it needs) is absent: the `[webrtc]` extra is not installed
    call = None
    log.info("WebRTC calls are off: %s is not installed (pip install 'voice-gateway[webrtc]')", e.name)

WEBRTC_MISSING = ("WebRTC is not installed on this server: install the webrtc extra (pip install "
                  "'voice-gateway[webrtc]'), or connect over the WebSocket at /v1/realtime")


@router.post("/v1/realtime/calls")
async def create_call(request: Request, model: str | None = None) -> Response:
    try:
        slot = request.app.state.admission.admit("webrtc", Caller.of(request), model)
    except Refused as refused:
        raise refused.as_api_error() from None
    try:
        if call is None:  # after admission: a caller without the key learns nothing of the server
            raise APIError(501, WEBRTC_MISSING, type="server_error", code="webrtc_not_installed")
        return await call.answer(request, slot)
    except BaseException:
        slot.release()  # a refused offer was never a session; an answered one releases in Call.close
        raise
