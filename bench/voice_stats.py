"""Per-level statistics of the realtime bench: each turn index and all turns together (mean/p50/p99 of the
spoken-turn latency, the silence window, the engine's own first packet and its parts, underruns), and how much
slower a conversation's later turns are."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from bench.stats import StageSteps, Stat
from bench.timeline import Window
from bench.turn import TurnRecord


@dataclass
class TurnStats:
    """The turns at one index of their conversations (`turn`), or every turn of the level (`turn` None);
    aggregates count completed turns only."""

    turn: int | None
    turns: int
    completed: int
    refused: int
    failures: int
    first_audio_s: Stat  # input end -> first audio
    done_s: Stat  # input end -> response.done
    vad_wait_s: Stat  # server VAD: the question's end -> speech_stopped, waited on top of first_audio_s
    speech_end_s: Stat  # server turn detection: the question's end -> first audio (what the user waits)
    engine_first_packet_s: Stat  # the engine's own first packet (response.timing): its request -> its first packet
    audio_s_mean: float | None
    input_tokens_mean: float | None  # the conversation so far, as the server counted it
    cached_tokens_mean: float | None  # of those, held by a cached prefix (the rest was prefilled)
    cached_share_mean: float | None  # per turn, cached / input tokens, averaged: how well a long call reuses its prefix
    image_tokens_mean: float | None  # of the input tokens, the pictures' (--image): every one the conversation holds
    underruns: int
    underrun_turns: int  # turns whose reply stalled at least once
    stall_ms_mean: float | None
    offset_errors: int  # Opus packets out of place, over all turns
    # where the engine's first packet went: each part's mean over the turns that report it (they add up to
    # engine_first_packet_s's mean where every turn does): turn 5 and turn 70 compared part by part
    engine_first_packet_parts_mean_s: dict[str, float] = field(default_factory=dict)


@dataclass
class VoiceLevelResult:
    mode: str
    output_format: str
    concurrency: int
    sessions: int
    wall_s: float
    turns_per_s: float  # completed turns / wall time
    overall: TurnStats
    by_turn: list[TurnStats]
    # per conversation, its slowest later turn's first audio / its first turn's (DESIGN.md: at most 1.25)
    later_turn_ratio: Stat
    records: list[TurnRecord]
    # the server's own mean from speech_stopped to the first audio sent (its /metrics; server VAD turns only)
    server_turn_latency_mean_s: float | None = None
    client_lag_ms: Stat = field(default_factory=Stat)  # the client's event loop lateness meanwhile
    server_steps: dict[str, StageSteps] = field(default_factory=dict)  # each stage's steps (bench/stats.py)
    # as a chat level's (bench/stats.py): the crossing to an engine's process, and the vision tower's calls
    server_crossing_mean_s: float | None = None
    server_image_decode_mean_s: float | None = None
    server_vision_tower_calls: int = 0
    server_vision_tower_mean_s: float | None = None
    timeline: list[Window] = field(default_factory=list)  # the server's steps window by window (bench/timeline.py)
    # turns its conversations did not start before the level's time limit (--time-limit); a failed turn's
    # conversation ends there too, but those turns are its failure's, not counted here
    turns_not_started: int = 0


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def _parts_mean(records: list[TurnRecord]) -> dict[str, float]:
    parts: dict[str, list[float]] = {}
    for r in records:
        for name, seconds in (r.first_packet_parts_s or {}).items():
            parts.setdefault(name, []).append(seconds)
    return {name: float(np.mean(values)) for name, values in parts.items()}


def turn_stats(turn: int | None, records: list[TurnRecord]) -> TurnStats:
    ok = [r for r in records if r.ok]
    refused = sum(1 for r in records if r.refused)
    return TurnStats(
        turn=turn, turns=len(records), completed=len(ok), refused=refused, failures=len(records) - len(ok) - refused,
        first_audio_s=Stat.of(r.first_audio_s for r in ok), done_s=Stat.of(r.done_s for r in ok),
        vad_wait_s=Stat.of(r.vad_wait_s for r in ok), speech_end_s=Stat.of(r.speech_end_s for r in ok),
        engine_first_packet_s=Stat.of(r.engine_first_packet_s for r in ok),
        audio_s_mean=_mean(r.audio_s for r in ok),
        input_tokens_mean=_mean(r.input_tokens for r in ok), cached_tokens_mean=_mean(r.cached_tokens for r in ok),
        cached_share_mean=_mean(r.cached_tokens / r.input_tokens for r in ok
                                if r.cached_tokens is not None and r.input_tokens),
        image_tokens_mean=_mean(r.image_tokens for r in ok),
        underruns=sum(r.underruns for r in ok),
        underrun_turns=sum(1 for r in ok if r.underruns), stall_ms_mean=_mean(r.stall_ms for r in ok),
        offset_errors=sum(r.offset_errors for r in records),
        engine_first_packet_parts_mean_s=_parts_mean(ok),
    )


def later_turn_ratios(records: list[TurnRecord]) -> list[float]:
    """Each conversation with a completed first turn and later ones: max(later first audio) / first turn's."""
    sessions: dict[int, dict[int, float]] = {}
    for r in records:
        if r.ok and r.first_audio_s is not None:
            sessions.setdefault(r.session, {})[r.turn] = r.first_audio_s
    return [max(v for t, v in turns.items() if t > 0) / turns[0]
            for turns in sessions.values() if 0 in turns and len(turns) > 1 and turns[0] > 0]


def summarize_voice_level(mode: str, output_format: str, concurrency: int, sessions: int,
                          records: list[TurnRecord], wall_s: float, turns: int = 0) -> VoiceLevelResult:
    """`turns`: each conversation's, to count those a time limit left unstarted (0: not counted)."""
    overall = turn_stats(None, records)
    indices = sorted({r.turn for r in records})
    return VoiceLevelResult(
        mode=mode, output_format=output_format, concurrency=concurrency, sessions=sessions, wall_s=wall_s,
        turns_per_s=overall.completed / wall_s if wall_s > 0 else 0.0, overall=overall,
        by_turn=[turn_stats(t, [r for r in records if r.turn == t]) for t in indices],
        later_turn_ratio=Stat.of(later_turn_ratios(records)), records=records,
        turns_not_started=turns_not_started(records, sessions, turns) if turns else 0,
    )


def turns_not_started(records: list[TurnRecord], sessions: int, turns: int) -> int:
    """Of `sessions` conversations of `turns` turns each, the turns that neither ran nor followed a failed one."""
    by_session: dict[int, list[TurnRecord]] = {}
    for record in sorted(records, key=lambda r: (r.session, r.turn)):
        by_session.setdefault(record.session, []).append(record)
    never_begun = (sessions - len(by_session)) * turns
    return never_begun + sum(turns - len(done) for done in by_session.values() if done[-1].ok)
