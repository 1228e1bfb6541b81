"""A session's bounded send queue: what the transport writes out, in order. Response audio is tagged with its
response id, so a barge-in drops what is still queued at once. Response audio that would take the queue past its
bound is refused (`Delivery.SLOW_CONSUMER`), and its sender fails that response; control events always queue."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from enum import Enum

Payload = str | bytes  # a JSON event, or a binary (Opus) frame


class Delivery(Enum):
    """The outbox's verdict on one send."""

    QUEUED = "queued"
    SLOW_CONSUMER = "slow_consumer"  # refused: the reader let the queue fill to its bound


@dataclass(slots=True)
class _Entry:
    payload: Payload
    response_id: str | None


class Outbox:
    def __init__(self, max_messages: int) -> None:
        self.max_messages = max_messages
        self._entries: deque[_Entry] = deque()
        self._ready = asyncio.Event()
        self.closed = False

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, payload: Payload, response_id: str | None = None, *, force: bool = False) -> Delivery:
        """Queue a message; `force` (control events) may exceed the bound, response audio may not."""
        if not force and len(self._entries) >= self.max_messages:
            return Delivery.SLOW_CONSUMER
        self._entries.append(_Entry(payload, response_id))
        self._ready.set()
        return Delivery.QUEUED

    def drop(self, response_id: str) -> int:
        kept = deque(e for e in self._entries if e.response_id != response_id)
        dropped = len(self._entries) - len(kept)
        self._entries = kept
        return dropped

    def close(self) -> None:
        self.closed = True
        self._ready.set()

    def get_nowait(self) -> Payload | None:
        return self._entries.popleft().payload if self._entries else None

    async def get(self) -> Payload | None:
        while not self._entries:
            if self.closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        return self._entries.popleft().payload
