"""`voice-gateway bench --phone`: C simulated phone calls at a time against a running server, each a conversation of
spoken questions sent as a caller's line would (20 ms µ-law frames in real time, silence between), the server's VAD
ending each turn. Measured per turn: the end of the caller's speech -> the first reply audio at the phone, and how
much audio ever waited at the phone (a burst swells it). The server must hold the Twilio auth token the bench signs
its webhooks with, and answer calls without an app (no VOICE_GATEWAY_PHONE_WEBHOOK_URL)."""

from __future__ import annotations

import asyncio
import logging
import math
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import soxr

from bench.config import BenchError
from bench.phone_carrier import FRAME_BYTES, CarrierCall, answer_stream, ring
from bench.result_file import write_json
from bench.speech import load_questions

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
_PAUSE_S = 0.5  # the caller's silence before each question
_QUIET_S = 3.0  # a reply has ended once the phone heard nothing new for this long (a stall shorter is a gap)


@dataclass
class PhoneBenchConfig:
    url: str = "http://127.0.0.1:8000"
    auth_token: str = ""
    concurrency: list[int] = field(default_factory=lambda: [1, 4])
    turns: int = 3
    questions: Path = Path("benchmarks/voice")
    timeout_s: float = 120.0  # per turn
    out: Path | None = None
    argv: list[str] = field(default_factory=list)


@dataclass
class TurnRecord:
    call: int
    turn: int
    question: str
    first_audio_s: float | None  # end of speech -> first reply frame at the phone; None: no reply in time
    reply_s: float  # the reply's audio, as played
    max_queued_ms: int
    gap_ms: int  # silence inside the reply: generation fell behind playback


async def _call(cfg: PhoneBenchConfig, index: int, questions: list[tuple[str, np.ndarray]]) -> list[TurnRecord]:
    reply, call_id = await ring(cfg.url, "twilio", auth_token=cfg.auth_token)
    if reply.status_code != 200:
        raise BenchError(f"the server refused the call: {reply.status_code} {reply.text[:200]} (does it hold the "
                         "same VOICE_GATEWAY_TWILIO_AUTH_TOKEN?)")
    url, params = answer_stream(reply.text)
    records = []
    async with CarrierCall("twilio", url, params, call_id) as call:
        for turn in range(cfg.turns):
            name, speech = questions[(index + turn) % len(questions)]
            await asyncio.sleep(_PAUSE_S)
            call.speak(speech)
            while call.speech_ended_at is None:
                await asyncio.sleep(0.01)
            ended = call.speech_ended_at
            heard, heard_before = call.heard, call.next_turn()
            first = await _reply_played(call, cfg.timeout_s)
            records.append(TurnRecord(index, turn, name, None if first is None else first - ended,
                                      (len(heard.ulaw) - heard_before) / FRAME_BYTES * 0.02,
                                      heard.max_queued_bytes // 8, heard.gap_ms))
    return records


async def _reply_played(call: CarrierCall, timeout_s: float) -> float | None:
    """When the reply's first frame reached the phone, once all of it has played; None if none came in time."""
    deadline = time.monotonic() + timeout_s
    last, since = call.frames_in, time.monotonic()
    while time.monotonic() < deadline and not call.closed.is_set():
        await asyncio.sleep(0.05)
        if call.frames_in != last or call.playing:
            last, since = call.frames_in, time.monotonic()
        elif call.heard.first_media_at is not None and time.monotonic() - since > _QUIET_S:
            return call.heard.first_media_at
    return call.heard.first_media_at


def _speech_only(samples: np.ndarray) -> np.ndarray:
    """The recording less its leading and trailing silence: the end of speech is the end of what is sent."""
    loud = np.flatnonzero(np.abs(samples) > 0.02)
    return samples[loud[0]:loud[-1] + 1] if loud.size else samples


def _summary(records: list[TurnRecord]) -> dict[str, Any]:
    latencies = sorted(r.first_audio_s for r in records if r.first_audio_s is not None)
    return {
        "turns": len(records), "answered": len(latencies),
        "first_audio_p50_s": round(statistics.median(latencies), 3) if latencies else None,
        # nearest rank: the smallest value at or above 90 % of the turns
        "first_audio_p90_s": round(latencies[math.ceil(0.9 * len(latencies)) - 1], 3) if latencies else None,
        "first_audio_max_s": round(latencies[-1], 3) if latencies else None,
        "max_queued_ms": max((r.max_queued_ms for r in records), default=0),
        "turns_with_gaps": sum(r.gap_ms > 0 for r in records),
        "gap_ms_total": sum(r.gap_ms for r in records),
    }


async def run_phone_bench(cfg: PhoneBenchConfig) -> dict[str, Any]:
    if not cfg.auth_token:
        raise BenchError("--phone needs the server's Twilio auth token (--twilio-auth-token, or "
                         "VOICE_GATEWAY_TWILIO_AUTH_TOKEN)")
    questions = [(q.name, _speech_only(soxr.resample(np.frombuffer(q.pcm16, "<i2").astype(np.float32) / 32768,
                                                     24_000, 8_000))) for q in load_questions(cfg.questions)]
    try:
        httpx.get(cfg.url + "/health", timeout=10)
    except httpx.HTTPError as e:
        raise BenchError(f"no server at {cfg.url}: {e}") from None
    levels = []
    for c in cfg.concurrency:
        started = time.monotonic()
        per_call = await asyncio.gather(*(_call(cfg, i, questions) for i in range(c)))
        records = [r for call in per_call for r in call]
        levels.append({"concurrency": c, "wall_s": round(time.monotonic() - started, 1), **_summary(records),
                       "records": [vars(r) for r in records]})
        log.info("phone bench c=%d: %s", c, _summary(records))
    result = {"kind": "phone", "url": cfg.url, "turns": cfg.turns, "questions": str(cfg.questions),
              "commit": _commit(), "command": " ".join(cfg.argv), "levels": levels}
    if cfg.out is not None:
        write_json(result, cfg.out, SCHEMA_VERSION)
    return result


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
