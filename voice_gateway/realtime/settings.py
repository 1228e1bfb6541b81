"""A session's settings: the `SessionConfig` that `session.update` changes and every response starts from."""

from __future__ import annotations

from voice_gateway.realtime import events as ev
from voice_gateway.realtime.checks import RequestChecks
from voice_gateway.realtime.reporter import ErrorReporter
from voice_gateway.realtime.sender import EventSender
from voice_gateway.realtime.tools import settle_tools


class SessionSettings:
    """Owns the session's config; `update` is its only writer."""

    def __init__(self, config: ev.SessionConfig, checks: RequestChecks, reporter: ErrorReporter,
                 sender: EventSender) -> None:
        self.config = config
        self.checks = checks
        self.reporter = reporter
        self.sender = sender

    def update(self, event: ev.SessionUpdate) -> ev.SessionConfig | None:
        """Apply `session.update` and answer `session.updated`; returns the config it replaced, None where the
        update was refused as a whole. A rejected setting is reported and left as it was; the rest applies."""
        for rejected in event.rejected:
            self.reporter.report(rejected)
        current = self.config
        try:
            config = ev.apply_session_update(current, event)
        except ev.ProtocolError as e:
            self.reporter.report(e)
            return None
        if not self.checks.text_fits(event.session.instructions, "instructions", event.event_id,
                                     "session.instructions"):
            config = config.model_copy(update={"instructions": current.instructions})
        if config.voice != current.voice and not self.checks.voice_exists(config.voice, event.event_id, "session"):
            config = config.model_copy(update={"voice": current.voice})
        config, tool_errors = settle_tools(current, config, event.event_id)
        for error in tool_errors:
            self.reporter.report(error)
        self.config = config
        self.sender.event(ev.SessionUpdated(session=config))
        return current
