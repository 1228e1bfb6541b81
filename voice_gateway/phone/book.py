"""The calls this server answered: those ringing while the app decides, each answered call's stream token until its
media stream claims it, and the live calls by their carrier call id (where the sideband and the call-control
routes find them). Behind several HTTP workers the tokens and the calls' whereabouts live in the folder the
workers share (`peers.py`), so that any worker can claim a token and find the worker holding a call."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from voice_gateway.phone.peers import Peers


class LiveCall(Protocol):
    """What the book's readers use of a live call (call.PhoneCall)."""

    call_id: str

    async def hang_up(self, reason: str) -> None: ...

    async def transfer(self, target: str) -> None: ...


@dataclass(slots=True)
class Answered:
    """A call this server answered: who may open its stream (`token`) and the session it starts with."""

    call_id: str
    carrier: str
    token: str
    session: dict[str, Any] = field(default_factory=dict)  # a session.update's `session`: the app's accept


class CallBook:
    """Owns the calls waiting for the app's decision, the answered calls (by token, until their stream claims
    them) and the live calls; `peers` where other workers share them."""

    def __init__(self, token_ttl_s: float, peers: Peers | None = None) -> None:
        self.token_ttl_s = token_ttl_s
        self.peers = peers
        self._deciding: dict[str, asyncio.Future[dict[str, Any] | None]] = {}  # the accepted session, or None
        self._answered: dict[str, tuple[Answered, float]] = {}  # by token, with when it expires
        self.live: dict[str, LiveCall] = {}

    @contextlib.contextmanager
    def ringing(self, call_id: str) -> Iterator[asyncio.Future[dict[str, Any] | None]]:
        """The app's decision on `call_id`, to await while the call rings."""
        future: asyncio.Future[dict[str, Any] | None] = asyncio.get_running_loop().create_future()
        self._deciding[call_id] = future
        self._hold(call_id)
        try:
            yield future
        finally:
            self._deciding.pop(call_id, None)
            self._release(call_id)

    def decide(self, call_id: str, session: dict[str, Any] | None) -> bool:
        """The app's accept (`session`) or reject (None) of a ringing call; False if no such call rings here."""
        future = self._deciding.get(call_id)
        if future is None or future.done():
            return False
        future.set_result(session)
        return True

    def answer(self, call_id: str, carrier: str, session: dict[str, Any] | None = None) -> Answered:
        answered = Answered(call_id, carrier, secrets.token_urlsafe(24), session or {})
        if self.peers is not None:
            self.peers.put_token(answered.token, asdict(answered))
        else:
            self._expire()
            self._answered[answered.token] = (answered, time.monotonic() + self.token_ttl_s)
        return answered

    def claim(self, token: str | None, call_id: str, carrier: str) -> Answered | None:
        """The answered call a stream's `start` names, once: None if the token is unknown, expired, or was given to
        another call or carrier."""
        if self.peers is not None:
            kept = self.peers.take_token(token, call_id, carrier)
            return Answered(**kept) if kept is not None else None
        self._expire()
        answered, _ = self._answered.get(token or "", (None, 0.0))
        if answered is None or answered.call_id != call_id or answered.carrier != carrier:
            return None
        del self._answered[answered.token]
        return answered

    def go_live(self, call: LiveCall) -> None:
        self.live[call.call_id] = call
        self._hold(call.call_id)

    def gone(self, call_id: str) -> None:
        if self.live.pop(call_id, None) is not None:
            self._release(call_id)

    def elsewhere(self, call_id: str) -> Path | None:
        """The socket of the worker that holds `call_id`, where another does; None where this one does, or none."""
        if call_id in self._deciding or call_id in self.live or self.peers is None:
            return None
        return self.peers.holder(call_id)

    def _hold(self, call_id: str) -> None:
        if self.peers is not None:
            self.peers.hold(call_id)

    def _release(self, call_id: str) -> None:
        if self.peers is not None:
            self.peers.release(call_id)

    def _expire(self) -> None:
        now = time.monotonic()
        for token in [t for t, (_, expires_at) in self._answered.items() if expires_at < now]:
            del self._answered[token]
