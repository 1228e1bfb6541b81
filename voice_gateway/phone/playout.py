"""A phone call's reply audio on its way to the caller's ear: 20 ms µ-law frames paced at the line's rate, a mark
after each, and what the caller has heard, which only the marks' echoes tell.

The carrier plays what it is sent in real time and buffers the rest; `lead_ms` is how far ahead of its playhead the
server may be (room for network jitter, too little for a burst to overflow its buffer or for a barge-in to leave
much unheard audio queued). A frame's mark names the item and how far into its audio the frame ends; when the
carrier echoes it, the caller has heard that far. On barge-in `interrupt` sends `clear`, forgets the marks still
out (the carrier echoes them as it drops their audio: those echoes are not hearing), and says where the item was
cut: the last echoed mark."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from voice_gateway.audio.g711 import ulaw_encode
from voice_gateway.phone.dialects import Dialect
from voice_gateway.realtime.audio_sinks import TrackSink

log = logging.getLogger(__name__)

FRAME_MS = 20
_IDLE_POLL_S = 0.01  # how often an idle line looks for reply audio: half a frame


@dataclass(frozen=True, slots=True)
class Cut:
    """Where a barge-in cut the caller off: `heard_ms` of `item_id`'s audio reached their ear."""

    item_id: str
    heard_ms: int


class Playout:
    """Owns the line's pacing clock, the marks sent and not echoed, and how much of each item was sent and heard."""

    def __init__(self, track: TrackSink, dialect: Dialect, stream_id: str, send: Callable[[str], Awaitable[None]],
                 lead_ms: int, call_id: str) -> None:
        assert track.rate_hz == 8000, f"a phone line plays 8 kHz, got a {track.rate_hz} Hz track"
        self.track = track
        self.dialect = dialect
        self.stream_id = stream_id
        self.send = send
        self.lead_s = lead_ms / 1000
        self.call_id = call_id
        self._dry_at = 0.0  # monotonic time at which the carrier has played all it was sent
        self._marks: dict[str, tuple[str, int]] = {}  # mark name -> (item id, ms of its audio up to there)
        self._sent_at: dict[str, float] = {}  # mark name -> when it left (monotonic), while not echoed
        self._sent_ms: dict[str, int] = {}
        self.heard_ms: dict[str, int] = {}
        self._next_mark = 0
        self.frames_sent = 0
        self.first_frame_at: float | None = None  # the latest reply's first frame (monotonic), for the bench's log

    @property
    def unheard(self) -> bool:
        """Whether audio was sent that the caller has not heard yet (or is queued to be sent)."""
        return bool(self._marks) or self.track.has_audio

    async def run(self) -> None:
        while True:
            now = time.monotonic()
            if not self.track.has_audio:
                await asyncio.sleep(_IDLE_POLL_S)
                continue
            ahead_s = self._dry_at - now
            if ahead_s >= self.lead_s:
                await asyncio.sleep(ahead_s - self.lead_s + 0.001)
                continue
            await self._send_frame(now)

    async def _send_frame(self, now: float) -> None:
        samples = self.track.next_frame()
        response_id = self.track.playing
        item_id = self.track.item_of(response_id) if response_id is not None else None
        if item_id is None:
            return  # the reply was cleared between the check and the frame
        if self._dry_at <= now:
            self.first_frame_at = now  # the line was silent: a reply (or its next part) starts
        self._dry_at = max(self._dry_at, now) + FRAME_MS / 1000
        sent_ms = self._sent_ms.get(item_id, 0) + FRAME_MS
        self._sent_ms[item_id] = sent_ms
        name = f"{item_id}:{sent_ms}:{self._next_mark}"
        self._next_mark += 1
        self._marks[name] = (item_id, sent_ms)
        self._sent_at[name] = now
        self.frames_sent += 1
        await self.send(self.dialect.media(self.stream_id, ulaw_encode(samples)))
        await self.send(self.dialect.mark(self.stream_id, name))

    def echoed(self, name: str) -> None:
        """The carrier played the audio before mark `name` (a name it was not sent, or one cleared, is ignored)."""
        entry = self._marks.pop(name, None)
        self._sent_at.pop(name, None)
        if entry is None:
            return
        item_id, ms = entry
        self.heard_ms[item_id] = max(self.heard_ms.get(item_id, 0), ms)

    async def interrupt(self) -> Cut | None:
        """Barge-in: drop what the carrier still holds; where the item being played was cut, if audio was unheard."""
        if not self._marks:
            return None
        item_id = next(iter(self._marks.values()))[0]
        self._marks.clear()
        self._sent_at.clear()
        self._dry_at = 0.0
        await self.send(self.dialect.clear(self.stream_id))
        cut = Cut(item_id, self.heard_ms.get(item_id, 0))
        log.info("call %s: barge-in, clear sent; %s heard to %d ms of %d sent", self.call_id, item_id, cut.heard_ms,
                 self._sent_ms.get(item_id, 0))
        return cut

    @property
    def unechoed_s(self) -> float:
        """How long the oldest mark not yet echoed has been out: a carrier that plays (and reads) echoes each
        within about `lead_ms` of its sending; one that stopped reading never does."""
        oldest = next(iter(self._sent_at.values()), None)
        return 0.0 if oldest is None else time.monotonic() - oldest

    async def drained(self, timeout_s: float) -> bool:
        """Wait until all reply audio was heard (every mark echoed); False if `timeout_s` passed first."""
        deadline = time.monotonic() + timeout_s
        while self.unheard:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(FRAME_MS / 1000)
        return True
