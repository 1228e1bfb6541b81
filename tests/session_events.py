"""A realtime `Session` driven in process, as a socket would drive it: events in, the outbox's events out."""

from __future__ import annotations

import json
from typing import Any

from voice_gateway.realtime.frames import deliver
from voice_gateway.realtime.session import Session


def drain(session: Session) -> list[dict[str, Any]]:
    """Every event the session has queued for its client, in order."""
    out = []
    while (payload := session.outbox.get_nowait()) is not None:
        assert isinstance(payload, str)
        out.append(json.loads(payload))
    return out


async def send(to: Session, **event: Any) -> list[dict[str, Any]]:
    """Deliver one client event; the events it brought at once."""
    await deliver(to, json.dumps(event))
    return drain(to)
