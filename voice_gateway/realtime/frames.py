"""One incoming message, on either transport: decoded into a client event for the session, or answered with why not."""

from __future__ import annotations

from voice_gateway.realtime import events as ev
from voice_gateway.realtime.session import Session


def max_message_bytes(session: Session) -> int:
    # the base64 of the largest append OpenAI allows, and room for its JSON envelope
    return session.gateway.max_append_bytes * 4 // 3 + 4096


async def deliver(session: Session, raw: str | bytes) -> None:
    """Decode a WebSocket or data channel message and hand its event to `session`; a bad one becomes an error event."""
    limit = max_message_bytes(session)
    try:
        if len(raw) > limit:
            raise ev.ProtocolError("message_too_large",
                                   f"messages are limited to {session.gateway.max_append_bytes} bytes of audio")
        event = ev.parse_client_event(raw)
    except ev.ProtocolError as e:
        session.protocol_error(e)
        return
    await session.handle(event)
