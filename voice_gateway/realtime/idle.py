"""`idle_timeout_ms` (server VAD): the timer that asks for a reply when the user stays silent after one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class IdleTimer:
    """Owns a session's one pending idle timeout; the callback is given per arming, so no cycle outlives it."""

    def __init__(self) -> None:
        self._handle: asyncio.TimerHandle | None = None

    @property
    def armed(self) -> bool:
        return self._handle is not None

    def arm(self, delay_s: float, on_timeout: Callable[[], None]) -> None:
        self.disarm()

        def fire() -> None:
            self._handle = None
            on_timeout()

        self._handle = asyncio.get_running_loop().call_later(max(0.0, delay_s), fire)

    def disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()  # a cancelled handle lets go of its callback
            self._handle = None
