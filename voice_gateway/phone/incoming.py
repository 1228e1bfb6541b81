"""The carriers' answer webhooks: POST /v1/phone/{carrier}/incoming. A call is checked (Twilio's X-Twilio-Signature;
Telnyx's and Plivo's `?secret=`), put to the app when one is configured (it accepts with a session or rejects),
and answered with the document that connects it to the media stream, carrying a token that only this call's
stream can use, once."""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request
from fastapi.responses import Response

from voice_gateway.phone.answer import connect_document, media_url, public_url, reject_document
from voice_gateway.phone.app_webhook import incoming_call_event, notify_app
from voice_gateway.phone.book import CallBook
from voice_gateway.phone.config import PhoneConfig
from voice_gateway.phone.dialects import DIALECTS

log = logging.getLogger(__name__)
router = APIRouter()

# where each carrier's answer webhook names the call, the caller and the number called (form fields)
_CALL_FIELDS = {"twilio": ("CallSid", "From", "To"), "telnyx": ("CallSid", "From", "To"),
                "plivo": ("CallUUID", "From", "To")}


def _xml(text: str, status: int = 200) -> Response:
    return Response(text, status_code=status, media_type="application/xml")


@router.post("/v1/phone/{carrier}/incoming")
async def incoming(request: Request, carrier: str) -> Response:
    cfg: PhoneConfig = request.app.state.phone
    book: CallBook = request.app.state.phone_calls
    if carrier not in DIALECTS:
        return Response("no such carrier", status_code=404)
    # carriers post application/x-www-form-urlencoded (parsed here: Starlette's form parser needs python-multipart)
    form = dict(parse_qsl((await request.body()).decode(errors="replace"), keep_blank_values=True))
    if not _authentic(request, cfg, carrier, form):
        log.warning("%s answer webhook refused: bad or missing signature (call %s)", carrier,
                    form.get(_CALL_FIELDS[carrier][0], "?"))
        return Response("forbidden", status_code=403)
    id_field, from_field, to_field = _CALL_FIELDS[carrier]
    call_id = form.get(id_field)
    if not call_id:
        log.warning("%s answer webhook without %s", carrier, id_field)
        return Response(f"{id_field} missing", status_code=400)
    session = await _decision(cfg, book, carrier, call_id, form.get(from_field, ""), form.get(to_field, ""))
    if session is None:
        log.info("call %s: rejected", call_id)
        return _xml(reject_document(carrier))
    answered = book.answer(call_id, carrier, session)
    log.info("call %s: answered (%s)", call_id, carrier)
    return _xml(connect_document(carrier, media_url(request, cfg, carrier), answered.token))


def _authentic(request: Request, cfg: PhoneConfig, carrier: str, form: dict[str, str]) -> bool:
    if carrier == "twilio":
        signature = request.headers.get("x-twilio-signature")
        if cfg.twilio_auth_token is None or not signature:
            return False
        from twilio.request_validator import RequestValidator  # here: only a Twilio webhook needs it

        return bool(RequestValidator(cfg.twilio_auth_token).validate(public_url(request, cfg), form, signature))
    offered = request.query_params.get("secret", "")
    return cfg.carrier_secret is not None and hmac.compare_digest(offered.encode(), cfg.carrier_secret.encode())


async def _decision(cfg: PhoneConfig, book: CallBook, carrier: str, call_id: str, caller: str,
                    called: str) -> dict | None:
    """The session the call starts with ({} for the profile's), or None where the app rejected it or said nothing
    in time."""
    if cfg.app_webhook_url is None:
        return {}
    with book.ringing(call_id) as decided:
        event = incoming_call_event(call_id, caller, called, carrier)
        told = asyncio.create_task(notify_app(cfg.app_webhook_url, cfg.app_webhook_secret, event, cfg.app_decision_s))
        try:
            async with asyncio.timeout(cfg.app_decision_s):
                # the app may decide before its webhook's reply arrives (or one that failed got through)
                either: set[asyncio.Future[Any]] = {told, decided}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                if not decided.done() and not told.result():
                    return None
                return await decided
        except TimeoutError:
            log.warning("call %s: the app neither accepted nor rejected it in %.0f s", call_id, cfg.app_decision_s)
            return None
        finally:
            told.cancel()
