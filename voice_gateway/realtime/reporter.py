"""A session's errors to its client: every `error` event passes here, counted, logged with the session id, sent."""

from __future__ import annotations

import logging

from voice_gateway.metrics import GatewayMetrics
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.sender import EventSender

log = logging.getLogger(__name__)


class ErrorReporter:
    """Tells one session's client what it could not have, and counts it; owns no state of its own."""

    def __init__(self, sender: EventSender, metrics: GatewayMetrics, session_id: str) -> None:
        self.sender = sender
        self.metrics = metrics
        self.session_id = session_id

    def error(self, code: str, message: str, *, event_id: str | None = None, param: str | None = None) -> None:
        self.report(ev.ProtocolError(code, message, event_id, param))

    def report(self, e: ev.ProtocolError) -> None:
        self.metrics.protocol_errors.labels(e.code).inc()
        log.info("session %s error %s (param %s, event %s): %s", self.session_id, e.code, e.param or "-",
                 e.event_id or "-", e.message)
        self.sender.event(ev.ErrorEvent.from_protocol_error(e))
