"""Call control: the built-in tools a call's model may use (`end_call`, `transfer_call`) and the carrier's REST API
that hangs a call up or transfers it, for the model's calls and the app's `/v1/realtime/calls/{id}/hangup|refer`.

Twilio's goes through the `twilio` package's client (its REST base URL configurable, so a test can serve it); its
client is synchronous (requests), so each request runs on a thread, off the event loop. Telnyx and Plivo calls end
when their stream closes, and are not transferred here (their call-control APIs are the app's to use)."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol
from xml.sax.saxutils import escape

from voice_gateway.phone.config import PhoneConfig
from voice_gateway.realtime.events import FunctionTool

log = logging.getLogger(__name__)

CALL_TOOLS = {
    "end_call": FunctionTool(name="end_call", description="Hang up the phone call. Say goodbye first.",
                             parameters={"type": "object", "properties": {}}),
    "transfer_call": FunctionTool(
        name="transfer_call", description="Transfer the caller to another phone number or SIP address.",
        # the target's form bounds the model's arguments: a carrier dials nothing else, and an unbounded string lets
        # a small model write on to the end of its context
        parameters={"type": "object", "properties": {"target": {
            "type": "string", "description": "E.164 number or sip: URI",
            "pattern": r"^(\+[1-9][0-9]{6,14}|sips?:[A-Za-z0-9._~%+@:;=-]{3,120})$"}}, "required": ["target"]}),
}


class CarrierControl(Protocol):
    async def hang_up(self, call_id: str) -> None: ...

    async def transfer(self, call_id: str, target: str) -> None: ...


class TwilioControl:
    """Owns the Twilio REST client of the account the calls belong to."""

    def __init__(self, account_sid: str, auth_token: str, api_base: str | None) -> None:
        from twilio.rest import Client  # here: a server that takes no Twilio calls never loads the client

        self.client = Client(account_sid, auth_token)
        if api_base is not None:
            self.client.api.base_url = api_base  # the Api domain's own setting: every Calls request goes there

    async def hang_up(self, call_id: str) -> None:
        await asyncio.to_thread(lambda: self.client.calls(call_id).update(status="completed"))
        log.info("call %s: hung up through Twilio's REST API", call_id)

    async def transfer(self, call_id: str, target: str) -> None:
        # new TwiML for the live call: the stream ends and Twilio dials the target
        dial = f"<Response><Dial>{escape(target)}</Dial></Response>"
        await asyncio.to_thread(lambda: self.client.calls(call_id).update(twiml=dial))
        log.info("call %s: transferred to %s through Twilio's REST API", call_id, target)


class StreamControl:
    """Telnyx and Plivo: hanging up closes the stream (their answer document then ends the call); no transfer."""

    async def hang_up(self, call_id: str) -> None:
        log.info("call %s: ended by closing its stream", call_id)

    async def transfer(self, call_id: str, target: str) -> None:
        raise NotImplementedError("transfer is served for Twilio calls; use your carrier's call-control API")


def control_for(carrier: str, cfg: PhoneConfig) -> CarrierControl:
    if carrier == "twilio" and cfg.twilio_account_sid and cfg.twilio_auth_token:
        return TwilioControl(cfg.twilio_account_sid, cfg.twilio_auth_token, cfg.twilio_api_base)
    return StreamControl()
