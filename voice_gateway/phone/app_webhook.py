"""The incoming-call webhook to the app's server: signed as OpenAI signs its webhooks (the Standard Webhooks
scheme: `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">`
under the base64 key after `whsec_`), so the app verifies it with the same code. The app answers by calling
`/v1/realtime/calls/{call_id}/accept` (with a session) or `/reject`."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import itertools
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
    """POST the event until the app takes it (2xx): True; False when it refuses (another 4xx) or `timeout_s` ends.
    A transport error, a 5xx or a 429 is tried again after a growing pause, under the same `webhook-id` (the
    Standard Webhooks' way to let the app drop a repeat) and a fresh timestamp and signature."""
    webhook_id, pause_s = f"wh_{secrets.token_hex(12)}", _FIRST_RETRY_S
    try:
        async with asyncio.timeout(timeout_s), httpx.AsyncClient(timeout=timeout_s) as client:
            for attempt in itertools.count(1):
                headers = {"content-type": "application/json"}
                if secret is not None:
                    headers |= signature_headers(secret, body, webhook_id, int(time.time()))
                try:
                    reply = await client.post(url, content=body, headers=headers)
                except httpx.HTTPError as e:
                    log.warning("the app's webhook %s failed (attempt %d): %s", url, attempt, e)
                else:
                    if reply.status_code // 100 == 2:
                        return True
                    log.warning("the app's webhook %s answered %d (attempt %d)", url, reply.status_code, attempt)
                    if reply.status_code // 100 == 4 and reply.status_code != 429:
                        return False
                await asyncio.sleep(pause_s)
                pause_s *= 2
    except TimeoutError:
        log.warning("the app's webhook %s did not take the call within %.0f s", url, timeout_s)
    return False


_FIRST_RETRY_S = 0.2  # then 0.4, 0.8, ...: a restarting app is back within the carrier's wait, or the call is lost
