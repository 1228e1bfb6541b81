"""A session's way out: server events serialised in its dialect, and binary frames, into its outbox."""

from __future__ import annotations

from voice_gateway.realtime import events as ev
from voice_gateway.realtime.outbox import Delivery, Outbox


class EventSender:
    """Writes into one outbox; the session, its audio sink and its response runner all send through it."""

    def __init__(self, outbox: Outbox, dialect: ev.Dialect) -> None:
        self.outbox = outbox
        self.dialect = dialect

    def event(self, event: ev.ServerEvent, response_id: str | None = None) -> Delivery:
        """Queue an event; response audio (tagged with `response_id`) may be refused by a full outbox."""
        text = ev.serialize(event, self.dialect)
        if text is None:
            return Delivery.QUEUED  # an event this dialect does not know: nothing to send, nothing refused
        return self.outbox.put(text, response_id, force=response_id is None)

    def binary(self, data: bytes, response_id: str) -> Delivery:
        return self.outbox.put(data, response_id)

    def drop(self, response_id: str) -> int:
        return self.outbox.drop(response_id)
