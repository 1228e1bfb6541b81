"""How long an engine process has been silent, as its supervisor judges a stall: time in which the supervisor's own
process did not run is not the engine's silence.

A supervisor that wakes much later than `STATE_PERIOD_S` was stopped too (a paused container, a migrated VM, a
starved host); the engine's words may be waiting unread in the pipe, and counting the gap would kill a healthy
engine. So after such a gap the clock starts again: a really stalled engine is caught `stall_timeout_s` of the
supervisor's own time later."""

from __future__ import annotations

import time

from engine.remote.messages import STATE_PERIOD_S

OVERSLEPT_S = 1.0  # a look this much later than due: the supervisor itself did not run


class Silence:
    """Owns when the engine was last heard and when the supervisor last looked."""

    def __init__(self) -> None:
        self._heard_at = self._looked_at = time.monotonic()

    def heard(self) -> None:
        self._heard_at = time.monotonic()

    @property
    def seconds(self) -> float:
        """The engine's silence so far, as /health reports it."""
        return time.monotonic() - self._heard_at

    def look(self) -> float:
        """The silence that counts against the engine, now; the supervisor calls this every period."""
        now = time.monotonic()
        if now - self._looked_at > STATE_PERIOD_S + OVERSLEPT_S:
            self._heard_at = now
        self._looked_at = now
        return now - self._heard_at
