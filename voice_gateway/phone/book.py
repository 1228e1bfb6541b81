"""The calls this server answered: each one's per-call stream token until its media stream starts, and the live
calls by their carrier call id (where the sideband and the call-control routes find them)."""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Protocol


class LiveCall(Protocol):
    """What the book's readers use of a live call (call.PhoneCall)."""

    call_id: str

    async def hang_up(self, reason: str) -> None: ...

    async def transfer(self, target: str) -> None: ...


@dataclass(slots=True)
class Answered:
    """A call this server answered: who may open its stream (`token`), by when, and the session it starts with."""

    call_id: str
    carrier: str
    token: str
    expires_at: float
    session: dict[str, Any] = field(default_factory=dict)  # a session.update's `session`: the app's accept


class CallBook:
    """Owns the calls waiting for the app's decision (by call id), the answered calls (by token, until their stream
    claims them) and the live calls (by call id)."""

    def __init__(self, token_ttl_s: float) -> None:
        self.token_ttl_s = token_ttl_s
        self.deciding: dict[str, asyncio.Future[dict[str, Any] | None]] = {}  # the accepted session, or None
        self._answered: dict[str, Answered] = {}
        self.live: dict[str, LiveCall] = {}

    def decide(self, call_id: str, session: dict[str, Any] | None) -> bool:
        """The app's accept (`session`) or reject (None) of a ringing call; False if no such call rings."""
        future = self.deciding.get(call_id)
        if future is None or future.done():
            return False
        future.set_result(session)
        return True

    def answer(self, call_id: str, carrier: str, session: dict[str, Any] | None = None) -> Answered:
        self._expire()
        answered = Answered(call_id, carrier, secrets.token_urlsafe(24), time.monotonic() + self.token_ttl_s,
                            session or {})
        self._answered[answered.token] = answered
        return answered

    def claim(self, token: str | None, call_id: str, carrier: str) -> Answered | None:
        """The answered call a stream's `start` names, once: None if the token is unknown, expired, or was given to
        another call or carrier."""
        self._expire()
        answered = self._answered.get(token or "")
        if answered is None or answered.call_id != call_id or answered.carrier != carrier:
            return None
        del self._answered[answered.token]
        return answered

    def knows_token(self, token: str | None) -> bool:
        self._expire()
        return (token or "") in self._answered

    def _expire(self) -> None:
        now = time.monotonic()
        for token in [t for t, a in self._answered.items() if a.expires_at < now]:
            del self._answered[token]
