"""The realtime benchmark: at each (turn mode, output format, concurrency) level, C workers each hold one
conversation at a time over WS /v1/realtime (warm-up first), and ``{out_dir}/{label}.json`` plus ``{label}.png``
record every turn's latency by its index in the conversation."""

from __future__ import annotations

import asyncio
import logging
import math
import shlex
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import Progress

from bench import timeline
from bench.config import VoiceConfig
from bench.image import ImageInfo
from bench.machine import machine_info
from bench.plots import plot_voice
from bench.processes import Started, run_in_processes
from bench.realtime_session import run_session
from bench.result_file import write_json
from bench.server_metrics import (
    CROSSING,
    IMAGE_DECODE,
    STEP_HISTOGRAM,
    VISION_TOWER,
    count_between,
    server_latency_sums,
    step_shares,
)
from bench.speech import Question, load_questions
from bench.stats import Stat
from bench.sweep import first_send_delays, read_image, target_model, watch_loop_lag
from bench.turn import TurnRecord
from bench.voice_stats import VoiceLevelResult, summarize_voice_level

log = logging.getLogger(__name__)

VOICE_SCHEMA_VERSION = 1
_TURN_HISTOGRAM = "gateway_speech_stop_to_first_audio_seconds"  # the server's view of server-VAD turns


@dataclass
class VoiceResult:  # serialized as-is (plus schema_version) to {label}.json
    label: str
    benchmark: str  # "realtime": tells these files from the chat sweep's
    created: str
    command: str
    config: dict[str, Any]
    machine: dict[str, Any]
    server_models: dict[str, Any] | None
    questions: dict[str, float]  # name -> seconds of speech
    levels: list[VoiceLevelResult]
    image: ImageInfo | None = None  # the pictures the turns sent (--image)


@dataclass(frozen=True, slots=True)
class _Level:
    """What each session of a level does; picklable, for the client processes."""

    config: VoiceConfig
    model: str
    mode: str
    output_format: str
    questions: tuple[Question, ...]
    image_urls: tuple[str, ...] = ()  # the run's pictures (--image), made once per run: each turn one, in turn
    first_image: int = 0  # the picture of this level's first warm-up session's first turn

    def pictures(self, index: int, turns: int) -> tuple[str, ...]:
        """Session `index`'s pictures, turn by turn (warm-ups are -warmup..-1): the run's in order."""
        if not self.image_urls:
            return ()
        first = self.first_image + (index + self.config.warmup) * turns
        return tuple(self.image_urls[(first + t) % len(self.image_urls)] for t in range(turns))


async def _run_sessions(level: _Level, indices: Iterable[int], workers: int, turns: int,
                        on_done: Callable[[], None], limit_s: float = 0.0) -> list[TurnRecord]:
    """`workers` conversations at a time; each worker starts the next session when its last one ends, its first
    a random 0-`spread_s` s late; `limit_s` > 0: no session or turn starts that many seconds from now or later."""
    deadline = time.perf_counter() + limit_s if limit_s else math.inf
    indices = list(indices)
    pending = iter(indices)
    records: list[TurnRecord] = []

    async def worker(delay: float) -> None:
        await asyncio.sleep(delay)
        for index in pending:
            if time.perf_counter() >= deadline:
                break
            records.extend(await run_session(level.config, level.model, level.mode, level.output_format,
                                             level.questions, index, turns, level.pictures(index, turns), deadline))
            on_done()

    delays = first_send_delays(f"voice:{indices[:1]}", workers, level.config.spread_s)
    await asyncio.gather(*(worker(delay) for delay in delays))
    return records


async def _sessions_work(level: _Level, indices: list[int], workers: int, started: Started) -> list[TurnRecord]:
    """One client process's share of a level (`processes.run_in_processes` runs it)."""
    await started()
    return await _run_sessions(level, indices, workers, level.config.turns, lambda: None, level.config.time_limit_s)


def sessions(config: VoiceConfig, concurrency: int) -> int:
    """Recorded conversations of a level at `concurrency`."""
    return config.num_sessions or concurrency


async def run_level(client: httpx.AsyncClient, level: _Level, concurrency: int, progress: Progress) -> VoiceLevelResult:
    config = level.config
    n = sessions(config, concurrency)
    task = progress.add_task(f"{level.mode} {level.output_format} C={concurrency}", total=config.warmup + n)
    advance = lambda: progress.advance(task)  # noqa: E731
    if config.warmup:
        warm = await _run_sessions(level, range(-config.warmup, 0), min(concurrency, config.warmup), 1, advance)
        if failed := [r.error for r in warm if not r.ok]:
            log.warning("%d warm-up turn(s) failed at %s %s C=%d: %s", len(failed), level.mode, level.output_format,
                        concurrency, failed[0])
    read = [_TURN_HISTOGRAM, STEP_HISTOGRAM, VISION_TOWER, CROSSING, IMAGE_DECODE]
    before = await server_latency_sums(client, read)
    lags: list[float] = []
    snapshots: list[timeline.Snapshot] = []
    watch = asyncio.create_task(watch_loop_lag(lags))
    sampler = asyncio.create_task(timeline.sample(client, snapshots))
    t0 = time.perf_counter()
    try:
        if config.client_processes > 1:
            records, wall_s = await asyncio.to_thread(run_in_processes, _sessions_work, level, n, concurrency,
                                                      config.client_processes)
            for _ in range(n):
                advance()
        else:
            records = await _run_sessions(level, range(n), concurrency, config.turns, advance, config.time_limit_s)
            wall_s = time.perf_counter() - t0
    finally:
        watch.cancel()
        sampler.cancel()
    await timeline.snapshot(client, snapshots)
    records.sort(key=lambda r: (r.session, r.turn))
    result = summarize_voice_level(level.mode, level.output_format, concurrency, n, records, wall_s, config.turns)
    if result.turns_not_started:
        log.warning("%s %s C=%d: the time limit (%g s) left %d of %d turns not started", level.mode,
                    level.output_format, concurrency, config.time_limit_s, result.turns_not_started, n * config.turns)
    after = await server_latency_sums(client, read)
    served = {name: (after[name][0] - before[name][0]) / count
              for name in after if name in before and (count := after[name][1] - before[name][1]) > 0}
    return replace(result, server_turn_latency_mean_s=served.get(_TURN_HISTOGRAM), client_lag_ms=Stat.of(lags),
                   server_steps=step_shares(before, after, wall_s), server_crossing_mean_s=served.get(CROSSING),
                   server_image_decode_mean_s=served.get(IMAGE_DECODE),
                   server_vision_tower_calls=count_between(before, after, VISION_TOWER), server_vision_tower_mean_s=served.get(VISION_TOWER),
                   timeline=timeline.windows(snapshots, records))


async def measure_voice(config: VoiceConfig, console: Console | None = None) -> VoiceResult:
    """Run every level against the server at config.url; writes nothing."""
    questions: Sequence[Question] = load_questions(config.questions)
    per_level = [(config.warmup + sessions(config, c)) * config.turns for _, _, c in config.levels()]
    image = read_image(config.image, sum(per_level))
    async with httpx.AsyncClient(base_url=config.url.rstrip("/"), timeout=config.timeout, trust_env=False) as client:
        model, models = await target_model(client, config.model, config.url)
        levels, first_image = [], 0
        with Progress(console=console or Console(stderr=True), disable=not config.show_progress) as progress:
            for (mode, output_format, concurrency), pictures in zip(config.levels(), per_level, strict=True):
                level = _Level(config, model, mode, output_format, tuple(questions),
                               image.data_urls if image else (), first_image)
                levels.append(await run_level(client, level, concurrency, progress))
                first_image += pictures
    cfg = asdict(replace(config, model=model))
    for key in ("argv", "show_progress"):
        cfg.pop(key)
    return VoiceResult(label=config.label, benchmark="realtime",
                       created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), command=shlex.join(config.argv),
                       config=cfg, machine=machine_info(), server_models=models,
                       questions={q.name: round(q.duration_s, 3) for q in questions}, levels=levels,
                       image=image.info if image else None)


async def run_voice_bench(config: VoiceConfig) -> VoiceResult:
    result = await measure_voice(config)
    out_dir = Path(config.out_dir)
    json_path = write_json(asdict(result), out_dir / f"{result.label}.json", VOICE_SCHEMA_VERSION)
    png_path = plot_voice([asdict(lv) for lv in result.levels], out_dir / f"{result.label}.png",
                          title=f"voice-gateway bench --realtime: {result.label}")
    log.info("wrote %s and %s", json_path, png_path)
    return result
