"""The playback clock: how much audio each speaking reply's listener holds, so that the least fed is fed first.

A listener plays a reply in real time from its first packet and stalls when it runs dry. What it holds at `now`
is the audio Code2Wav emitted less what it played: the time since its first packet, less the time it stalled.
Shared by the Code2Wav copies' threads, so every access takes a lock."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(slots=True)
class _Reply:
    started: float  # perf_counter() when its playback began, moved on by each stall
    emitted_s: float  # audio emitted so far

    def held_s(self, now: float) -> float:
        return self.started + self.emitted_s - now


class PlaybackClock:
    """Owns each speaking reply's first-packet time and emitted audio, from its first packet to its last."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._replies: dict[str, _Reply] = {}

    def emitted(self, request_id: str, audio_s: float, now: float | None = None) -> None:
        """`audio_s`: all the audio the reply has emitted so far."""
        now = time.perf_counter() if now is None else now
        with self._lock:
            if (reply := self._replies.get(request_id)) is None:
                self._replies[request_id] = _Reply(now, audio_s)
                return
            # ran dry before this packet: the listener waited, and plays on from here
            reply.started = max(reply.started, now - reply.emitted_s)
            reply.emitted_s = audio_s

    def finished(self, request_id: str) -> None:
        """Its last packet was emitted, or it was aborted: nobody waits for more of it."""
        with self._lock:
            self._replies.pop(request_id, None)

    def buffered_s(self, request_id: str, now: float | None = None) -> float | None:
        """Audio its listener holds now; None before its first packet."""
        now = time.perf_counter() if now is None else now
        with self._lock:
            reply = self._replies.get(request_id)
            return None if reply is None else reply.held_s(now)

    def least_buffered_s(self, now: float | None = None) -> float | None:
        """The least audio any speaking reply's listener holds now; None when no reply speaks."""
        now = time.perf_counter() if now is None else now
        with self._lock:
            if not self._replies:
                return None
            return min(r.held_s(now) for r in self._replies.values())
