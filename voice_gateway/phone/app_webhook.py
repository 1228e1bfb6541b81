"""The incoming-call webhook to the app's server: signed as OpenAI signs its webhooks (the Standard Webhooks
scheme: `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">`
under the base64 key after `whsec_`), so the app verifies it with the same code. The app answers by calling
`/v1/realtime/calls/{call_id}/accept` (with a session) or `/reject`."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import secrets
import time

import httpx

log = logging.getLogger(__name__)


def signature_headers(secret: str, body: bytes, webhook_id: str, timestamp: int) -> dict[str, str]:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    digest = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return {"webhook-id": webhook_id, "webhook-timestamp": str(timestamp), "webhook-signature": f"v1,{digest}"}


def incoming_call_event(call_id: str, caller: str, called: str, carrier: str) -> bytes:
    now = int(time.time())
    event = {"object": "event", "id": f"evt_{secrets.token_hex(12)}", "type": "realtime.call.incoming",
             "created_at": now, "data": {"call_id": call_id, "carrier": carrier,
                                         "sip_headers": [{"name": "From", "value": caller},
                                                         {"name": "To", "value": called}]}}
    return json.dumps(event).encode()


async def notify_app(url: str, secret: str | None, body: bytes, timeout_s: float) -> bool:
    """POST the event; True if the app took it (2xx)."""
    headers = {"content-type": "application/json"}
    if secret is not None:
        headers |= signature_headers(secret, body, f"wh_{secrets.token_hex(12)}", int(time.time()))
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            reply = await client.post(url, content=body, headers=headers)
    except httpx.HTTPError as e:
        log.warning("the app's webhook %s failed: %s", url, e)
        return False
    if reply.status_code // 100 != 2:
        log.warning("the app's webhook %s answered %d", url, reply.status_code)
        return False
    return True
