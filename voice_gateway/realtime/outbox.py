"""A session's bounded send queue: what the transport writes out, in order.

Audio of a response is tagged with its response id, so a barge-in can drop
whatever of it is still queued at once. A reader too slow to keep the queue
under its bound is told so; the caller then cancels its response.

An entry may be binary frames still being made off the event loop (Opus packets
that a thread encodes): it holds its place in the queue, and the writer waits for
it there, so what was queued after it still leaves after it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

Payload = str | bytes  # a JSON event, or a binary (Opus) frame
Later = asyncio.Future[list[bytes]]  # binary frames in the making


class OutboxFull(Exception):
    pass


@dataclass(slots=True)
class _Entry:
    payload: Payload | Later
    response_id: str | None
    messages: int = 1  # what it counts against the bound: a `Later`'s expected frames


class Outbox:
    def __init__(self, max_messages: int) -> None:
        self.max_messages = max_messages
        self._entries: deque[_Entry] = deque()
        self._messages = 0
        self._ready = asyncio.Event()
        self.closed = False

    def __len__(self) -> int:
        """Messages waiting, counting frames in the making as many as they are expected to be."""
        return self._messages

    def put(self, payload: Payload, response_id: str | None = None, *, force: bool = False) -> None:
        """Queue a message; `force` (control events) may exceed the bound, response audio may not."""
        self._append(_Entry(payload, response_id), force)

    def put_later(self, frames: Later, response_id: str, expected_frames: int) -> None:
        """Queue binary frames that `frames` will hold, in this place; a full outbox refuses them (OutboxFull)."""
        self._append(_Entry(frames, response_id, expected_frames), force=False)

    def _append(self, entry: _Entry, force: bool) -> None:
        if not force and self._messages + entry.messages > self.max_messages:
            raise OutboxFull(f"{self._messages} messages waiting")
        self._entries.append(entry)
        self._messages += entry.messages
        self._ready.set()

    def drop(self, response_id: str) -> int:
        """Forget the queued messages of one response, frames in the making too; returns how many."""
        kept: deque[_Entry] = deque()
        dropped = 0
        for e in self._entries:
            if e.response_id != response_id:
                kept.append(e)
                continue
            dropped += e.messages
            if isinstance(e.payload, asyncio.Future):
                e.payload.cancel()  # a job not started yet never runs
        self._entries = kept
        self._messages -= dropped
        return dropped

    def close(self) -> None:
        self.closed = True
        self._ready.set()

    def get_nowait(self) -> Payload | None:
        """The next message, or None when there is none yet (frames still in the making count as none)."""
        while self._entries:
            head = self._entries[0]
            if not isinstance(head.payload, asyncio.Future):
                return self._pop()
            if not head.payload.done():
                return None
            self._expand()
        return None

    async def get(self) -> Payload | None:
        """The next message, or None once closed and empty."""
        while True:
            while not self._entries:
                if self.closed:
                    return None
                self._ready.clear()
                await self._ready.wait()
            head = self._entries[0]
            if not isinstance(head.payload, asyncio.Future):
                return self._pop()
            if head.payload.done():
                self._expand()
            else:
                await asyncio.wait([head.payload])  # then look again: a cancel may have dropped it meanwhile

    def _pop(self) -> Payload:
        entry = self._entries.popleft()
        self._messages -= entry.messages
        assert not isinstance(entry.payload, asyncio.Future), entry
        return entry.payload

    def _expand(self) -> None:
        """The head's frames are made: they take its place, one entry each."""
        entry = self._entries.popleft()
        assert isinstance(entry.payload, asyncio.Future), entry
        frames = entry.payload.result()  # an encoder's error surfaces in the writer, which closes the session
        self._messages += len(frames) - entry.messages
        self._entries.extendleft(_Entry(f, entry.response_id) for f in reversed(frames))
