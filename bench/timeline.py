"""What the server's stages did over a realtime level, window by window: its /metrics read every few seconds
while the level runs, and each window's steps per stage and phase, the Thinker's prompt tokens a step, the
engine's own first packet and the turns that ended in it. A long call's first audio grows with its history;
the windows say whether a stage's steps grew with it, and which part of the engine's first packet did (the turns
of a level move through their conversations together, so a window's median turn index places it in the call)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx
import numpy as np

from bench.server_metrics import FIRST_PACKET_PART, STEP_HISTOGRAM, server_latency_sums, step_shares
from bench.stats import StageSteps
from bench.turn import TurnRecord

ENGINE_TTFP = "engine_ttfp_seconds"
PARTS = ("queued", "thinker", "talker_prefill", "talker_frames", "code2wav")  # engine/api.py FirstPacketParts
STEP_TOKENS = "engine_thinker_step_tokens"
PROMPT_TOKENS = f"{STEP_TOKENS}{{kind=prompt}}"
PROMPT_STEPS = f"{STEP_HISTOGRAM}{{phase=prefill,stage=thinker}}"
WINDOW_S = 10.0

Sums = dict[str, tuple[float, float]]


@dataclass(frozen=True, slots=True)
class Snapshot:
    at: float  # time.time(): the clock each turn's `ended_at` reads, in whichever client process it ran
    sums: Sums


@dataclass
class Window:
    start_s: float  # from the level's first snapshot
    end_s: float
    turns: int  # completed turns that ended in it
    turn_median: float | None  # their index in the conversation (0: a conversation's first turn)
    first_audio_p50_s: float | None
    engine_ttfp_mean_s: float | None  # the engine's own first packet (submit -> first packet), its /metrics
    steps: dict[str, StageSteps] = field(default_factory=dict)  # "stage/phase" -> its steps in the window
    # the Thinker's prompt tokens over its steps that carried any: with `steps`, what a prompt token cost
    prompt_tokens_per_step: float | None = None
    # where the first packet went: each part's mean over the window's spoken replies (they add up to
    # engine_ttfp_mean_s)
    engine_first_packet_parts_mean_s: dict[str, float] = field(default_factory=dict)


async def sample(client: httpx.AsyncClient, into: list[Snapshot], every_s: float = WINDOW_S) -> None:
    """Append a snapshot of the step and first-packet histograms every `every_s` until cancelled (the caller
    takes one more at the end)."""
    while True:
        await snapshot(client, into)
        await asyncio.sleep(every_s)


async def snapshot(client: httpx.AsyncClient, into: list[Snapshot]) -> None:
    sums = await server_latency_sums(client, [STEP_HISTOGRAM, ENGINE_TTFP, STEP_TOKENS, FIRST_PACKET_PART])
    if sums:  # a server without /metrics leaves no windows
        into.append(Snapshot(time.time(), sums))


def windows(snapshots: list[Snapshot], records: list[TurnRecord]) -> list[Window]:
    """One window between each two consecutive snapshots."""
    if len(snapshots) < 2:
        return []
    t0 = snapshots[0].at
    ended = [r for r in records if r.ok and r.ended_at is not None]
    out = []
    for before, after in zip(snapshots, snapshots[1:], strict=False):
        inside = [r for r in ended if before.at <= r.ended_at < after.at]  # type: ignore[operator]
        total, count = _gained(before, after, ENGINE_TTFP)
        parts = {part: _gained(before, after, f"{FIRST_PACKET_PART}{{part={part}}}") for part in PARTS}
        tokens, _ = _gained(before, after, PROMPT_TOKENS)
        _, prompt_steps = _gained(before, after, PROMPT_STEPS)
        out.append(Window(
            start_s=round(before.at - t0, 3), end_s=round(after.at - t0, 3), turns=len(inside),
            turn_median=float(np.median([r.turn for r in inside])) if inside else None,
            first_audio_p50_s=float(np.median([r.first_audio_s for r in inside])) if inside else None,
            engine_ttfp_mean_s=total / count if count > 0 else None,
            engine_first_packet_parts_mean_s={part: s / n for part, (s, n) in parts.items() if n > 0},
            steps=step_shares(before.sums, after.sums, after.at - before.at),
            prompt_tokens_per_step=tokens / prompt_steps if prompt_steps > 0 else None))
    return out


def _gained(before: Snapshot, after: Snapshot, key: str) -> tuple[float, float]:
    """A histogram's (sum, count) gained between two snapshots."""
    (total_after, count_after), (total_before, count_before) = (s.sums.get(key, (0.0, 0.0)) for s in (after, before))
    return total_after - total_before, count_after - count_before
