"""Per-level statistics: mean/p50/p99 of each client-side measure, throughput, playback underruns."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from bench.measure import RequestRecord


@dataclass(frozen=True, slots=True)
class StageSteps:
    """One stage's steps of one phase over a level, as the server counted them."""

    steps: int
    mean_ms: float
    busy_share: float  # its steps' wall time over the level's: above 1 where replicas step at once


@dataclass
class Stat:
    mean: float | None = None
    p50: float | None = None
    p99: float | None = None

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Stat:
        arr = np.asarray([v for v in values if v is not None], dtype=float)
        if arr.size == 0:
            return cls()  # None, not NaN: NaN is not valid JSON
        # numpy's default (linear interpolation between the two nearest ranks)
        return cls(float(arr.mean()), float(np.percentile(arr, 50)), float(np.percentile(arr, 99)))


@dataclass
class LevelResult:
    """One (prompt length, concurrency) pair of a sweep; aggregates count successful requests only."""

    concurrency: int
    prompt_words: int  # what the client asked for; prompt_tokens_mean is what the server counted
    num_requests: int
    completed: int
    refused: int  # told 429/503 (overloaded or unavailable): the server's honest no, not a failure
    failures: int
    wall_s: float
    req_per_s: float
    ttft_s: Stat
    ttfp_s: Stat
    rtf: Stat
    latency_s: Stat
    chunk_gap_ms: Stat  # between consecutive audio chunks of one reply
    audio_s_mean: float | None
    prompt_tokens_mean: float | None
    image_tokens_mean: float | None  # of those, the picture's (--image): what one picture costs in the prompt
    completion_tokens_mean: float | None  # text tokens + codec frames, as usage reports them
    audio_frames_mean: float | None
    underruns: int  # total over the level's replies
    underrun_requests: int  # replies that stalled at least once
    stall_ms_mean: float | None
    records: list[RequestRecord]
    # the server's own view (its /metrics, engine submit to first event), when it exports one:
    # the gap to ttft_s/ttfp_s is what HTTP, the event loop and the client add
    server_ttft_mean_s: float | None = None
    server_ttfp_mean_s: float | None = None
    # where the engine's first packet went: each part's mean (engine/api.py FirstPacketParts; they add up to it)
    server_first_packet_parts_mean_s: dict[str, float] = field(default_factory=dict)
    # ... and from the request's arrival in the app to the chunk written: adds the HTTP side's share
    server_http_ttft_mean_s: float | None = None
    server_http_ttfp_mean_s: float | None = None
    # of the time before the engine, a request's way to an engine in a process of its own (None: in the server's)
    server_crossing_mean_s: float | None = None
    # ... and before it, in the server, each picture's decoding (gateway_image_decode_seconds)
    server_image_decode_mean_s: float | None = None
    # the vision tower's calls over the level (one a step that carried pictures) and their mean host time
    server_vision_tower_calls: int = 0
    server_vision_tower_mean_s: float | None = None
    # how late this client's own event loop woke for a 5 ms timer meanwhile: when it is busy, every
    # client-side time above is late by about this much
    client_lag_ms: Stat = field(default_factory=Stat)
    # request sent -> response headers: the server sends them with the engine's first event (text), so
    # this is about TTFT; much more than TTFT is the request's way in (client pool, connect, accept)
    headers_s: Stat = field(default_factory=Stat)
    # each stage's steps over the level, by "stage/phase" (the server's /metrics): which stage held the GPU
    server_steps: dict[str, StageSteps] = field(default_factory=dict)


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def summarize_level(concurrency: int, records: list[RequestRecord], wall_s: float,
                    prompt_words: int = 0) -> LevelResult:
    ok = [r for r in records if r.ok]
    refused = sum(1 for r in records if r.retry_after_s is not None)
    return LevelResult(
        concurrency=concurrency, prompt_words=prompt_words, num_requests=len(records), completed=len(ok),
        refused=refused, failures=len(records) - len(ok) - refused, wall_s=wall_s,
        req_per_s=len(ok) / wall_s if wall_s > 0 else 0.0,
        ttft_s=Stat.of(r.ttft_s for r in ok), ttfp_s=Stat.of(r.ttfp_s for r in ok),
        rtf=Stat.of(r.rtf for r in ok), latency_s=Stat.of(r.latency_s for r in ok),
        chunk_gap_ms=Stat.of(g for r in ok for g in r.chunk_gaps_ms),
        audio_s_mean=_mean(r.audio_s for r in ok),
        prompt_tokens_mean=_mean(r.prompt_tokens for r in ok),
        image_tokens_mean=_mean(r.image_tokens for r in ok),
        completion_tokens_mean=_mean(r.completion_tokens for r in ok),
        audio_frames_mean=_mean(r.audio_frames for r in ok),
        underruns=sum(r.underruns for r in ok),
        underrun_requests=sum(1 for r in ok if r.underruns),
        stall_ms_mean=_mean(r.stall_ms for r in ok),
        records=records, headers_s=Stat.of(r.headers_s for r in ok),
    )
