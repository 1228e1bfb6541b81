"""`voice-gateway bench`: load generation against a live server (sweeps of prompt length x
concurrency), ladders of servers that each add one optimisation, and their JSON and figures.

It talks to servers over HTTP and starts them as `python -m voice_gateway.cli serve` subprocesses:
it imports neither `voice_gateway` nor `engine`, and needs the `[bench]` extra (matplotlib, rich).

    measure.py   one streamed reply: SSE decoding, TTFT/TTFP/RTF, the real-time playback model
    stats.py     per-level mean/p50/p99, req/s, underruns
    config.py    what one sweep does (BenchConfig) and checked sweep settings from ladder files
    sweep.py     the levels, warm-up, the request pool, {label}.json and .png
    processes.py a level spread over client processes, each with its own event loop
    ladder.py    one server per row, DIR/<row>.json, DIR/ladder.json and the ladder's figures
    server.py    a `voice-gateway serve` subprocess on a free loopback port
    plots.py     the figures
    machine.py   what a result ran on
    cli.py       the command line
"""

from bench.cli import add_bench_arguments, bench_main, config_from_args
from bench.config import BenchConfig, BenchError
from bench.ladder import Ladder, LadderRow, RowOutcome, load_ladder, run_ladder
from bench.measure import (
    SAMPLE_RATE,
    RequestRecord,
    ServerStreamError,
    SSEDecoder,
    StreamTimer,
    playback_underruns,
)
from bench.plots import plot_compare
from bench.stats import LevelResult, Stat, summarize_level
from bench.sweep import BenchResult, build_payload, make_prompt, measure, run_bench

__all__ = [
    "SAMPLE_RATE",
    "BenchConfig",
    "BenchError",
    "BenchResult",
    "Ladder",
    "LadderRow",
    "LevelResult",
    "RequestRecord",
    "RowOutcome",
    "SSEDecoder",
    "ServerStreamError",
    "Stat",
    "StreamTimer",
    "add_bench_arguments",
    "bench_main",
    "build_payload",
    "config_from_args",
    "load_ladder",
    "make_prompt",
    "measure",
    "playback_underruns",
    "plot_compare",
    "run_bench",
    "run_ladder",
    "summarize_level",
]
