"""Client-side measurement of one streamed reply: SSE decoding, the per-request record, and the
real-time playback model that counts underruns. Times are seconds from just before the request
was sent (DESIGN.md section 7)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

SAMPLE_RATE = 24_000
BYTES_PER_SAMPLE = 2


class ServerStreamError(ValueError):
    """The server sent an OpenAI error object inside the SSE stream (counts as a failure)."""


@dataclass
class RequestRecord:
    index: int
    concurrency: int
    prompt_words: int = 0
    ok: bool = False
    error: str | None = None
    status: int | None = None
    retry_after_s: float | None = None  # refused as overloaded or unavailable (429/503): when to try again
    headers_s: float | None = None  # the response's status line and headers
    ttft_s: float | None = None
    ttfp_s: float | None = None
    latency_s: float | None = None
    rtf: float | None = None
    audio_s: float = 0.0
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # usage.prompt_tokens: what the server counted
    image_tokens: int | None = None  # of those, the picture's: usage.prompt_tokens_details.image_tokens
    completion_tokens: int | None = None
    audio_frames: int | None = None  # usage.completion_tokens_details.audio_tokens
    chunk_gaps_ms: list[float] = field(default_factory=list)  # between consecutive audio chunks
    underruns: int = 0
    stall_ms: float = 0.0


class SSEDecoder:
    """Incremental SSE decoder: feed lines, get each event's joined ``data`` back."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> str | None:
        line = line.rstrip("\r\n")
        if not line:
            return self.flush()
        if line.startswith(":"):
            return None  # comment / keep-alive
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None

    def flush(self) -> str | None:
        """Emit a pending event; also needed at EOF when the last blank line is missing."""
        if not self._data:
            return None
        data, self._data = "\n".join(self._data), []
        return data


def playback_underruns(arrivals: list[tuple[float, float]]) -> tuple[int, float]:
    """(underrun count, total stall ms) for a player that starts at the first audio byte and
    plays in real time; ``arrivals`` are (arrival time s, duration s) in arrival order."""
    starts = accumulate((d for _, d in arrivals), initial=0.0)  # a chunk starts where the last ended; the extra last start is the end
    return scheduled_underruns([(t, start) for (t, _), start in zip(arrivals, starts, strict=False)])


def scheduled_underruns(pieces: list[tuple[float, float]]) -> tuple[int, float]:
    """(underrun count, total stall ms) for a player that starts at the first piece and plays in real time;
    ``pieces`` are (arrival time s, where the piece starts in the reply s) in arrival order.

    A piece is due when the player reaches its start: first arrival + (start - first start) + the stalls so
    far. One that arrives later is an underrun: playback waits for it, so the stall moves every later due time."""
    if not pieces:
        return 0, 0.0
    t0 = pieces[0][0] - pieces[0][1]
    count, stall = 0, 0.0
    for t, start in pieces[1:]:
        due = t0 + start + stall
        if t > due:  # the buffer ran dry before this piece arrived
            count, stall = count + 1, stall + (t - due)
    return count, stall * 1000.0


class StreamTimer:
    """Folds one response's timestamped SSE events into its RequestRecord."""

    def __init__(self, record: RequestRecord, t_send: float) -> None:
        self.record, self.t_send = record, t_send
        self.done = False
        self._t_last: float | None = None
        self._arrivals: list[tuple[float, float]] = []  # (arrival s, duration s) per audio chunk

    def on_data(self, data: str, now: float) -> None:
        t = now - self.t_send
        self._t_last = t
        if data.strip() == "[DONE]":
            self.done = True
            return
        chunk = json.loads(data)
        if "error" in chunk:
            raise ServerStreamError(error_text(chunk))
        rec = self.record
        choice = (chunk.get("choices") or [{}])[0]
        delta = choice.get("delta") or {}
        audio = delta.get("audio") or {}
        # With audio on, OpenAI streams the text as the audio's transcript instead of `content`.
        if (delta.get("content") or audio.get("transcript")) and rec.ttft_s is None:
            rec.ttft_s = t
        if b64 := audio.get("data"):
            if self._arrivals:
                rec.chunk_gaps_ms.append((t - self._arrivals[-1][0]) * 1000.0)
            self._arrivals.append((t, len(base64.b64decode(b64)) / BYTES_PER_SAMPLE / SAMPLE_RATE))
            rec.ttfp_s = t if rec.ttfp_s is None else rec.ttfp_s
        rec.finish_reason = choice.get("finish_reason") or rec.finish_reason
        if usage := chunk.get("usage"):
            rec.prompt_tokens = usage.get("prompt_tokens")
            rec.image_tokens = (usage.get("prompt_tokens_details") or {}).get("image_tokens")
            rec.completion_tokens = usage.get("completion_tokens")
            rec.audio_frames = (usage.get("completion_tokens_details") or {}).get("audio_tokens")

    def finish(self, now: float) -> None:
        rec = self.record
        rec.latency_s = self._t_last if self.done else now - self.t_send
        rec.audio_s = sum(d for _, d in self._arrivals)
        if rec.audio_s > 0:
            rec.rtf = self._arrivals[-1][0] / rec.audio_s
        rec.underruns, rec.stall_ms = playback_underruns(self._arrivals)


def error_text(body: Any) -> str:
    """Best-effort message from an OpenAI ``{"error": {...}}`` body (dict or raw bytes)."""
    try:
        body = json.loads(body) if isinstance(body, bytes) else body
        err = body["error"]
        return str(err.get("message") or err if isinstance(err, dict) else err)[:500]
    except (ValueError, TypeError, KeyError):
        return repr(body)[:500]
