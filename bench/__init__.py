"""`voice-gateway bench`: load generation against a live server (sweeps of prompt length x
concurrency; spoken conversations over the realtime WebSocket with `--realtime`), ladders of
servers that each add one optimisation, soaks, and their JSON and figures.

It talks to servers over HTTP and starts them as `python -m voice_gateway.cli serve` subprocesses:
it imports neither `voice_gateway` nor `engine`, and needs the `[bench]` extra (matplotlib, rich).

    measure.py   one streamed reply: SSE decoding, TTFT/TTFP/RTF, the real-time playback model
    stats.py     per-level mean/p50/p99, req/s, underruns
    config.py    what one sweep does (BenchConfig) and checked sweep settings from ladder files
    sweep.py     the levels, warm-up, the request pool, {label}.json and .png
    processes.py a level spread over client processes, each with its own event loop
    speech.py    the spoken questions (benchmarks/voice/*.wav) as realtime PCM16 and chat input_audio
    image.py     the picture --image sends: a file, or a synthetic camera-like JPEG of a given size
    video.py     the clip --video sends in chat: a file, or a synthetic H.264 clip of a given size and length
    turn.py      one spoken turn: its record, the realtime events and Opus packets folded into it
    realtime_session.py  one conversation over WS /v1/realtime: session.update, paced audio, N turns
    voice_stats.py  per turn index and overall: first-audio latency, VAD wait, underruns
    voice.py     the realtime levels (mode x output format x concurrency), {label}.json and .png
    ladder.py    one server per row, DIR/<row>.json, DIR/ladder.json and the ladder's figures
    rows.py      a row's server for its sweeps: fresh for each, or held for the run and paused between
    rounds.py    a ladder's rows again, round after round: each row's TTFP paired with the first row's
    soak.py      `bench soak`: mixed traffic for a long while, the server's memory and open files sampled
    procstat.py  a process tree's RSS and open fds from /proc
    server.py    a `voice-gateway serve` subprocess on a free loopback port
    plots.py     the figures
    machine.py   what a result ran on
    summary.py   the tables and lines printed when a run ends
    cli.py       the command line
"""

from bench.cli import add_bench_arguments, bench_main, config_from_args
from bench.config import BenchConfig, BenchError, VoiceConfig
from bench.ladder import Ladder, LadderRow, load_ladder, run_ladder
from bench.measure import (
    SAMPLE_RATE,
    RequestRecord,
    ServerStreamError,
    SSEDecoder,
    StreamTimer,
    playback_underruns,
    scheduled_underruns,
)
from bench.plots import plot_compare
from bench.rows import RowOutcome
from bench.stats import LevelResult, Stat, summarize_level
from bench.sweep import BenchResult, build_payload, make_prompt, measure, run_bench
from bench.turn import TurnRecord, TurnTimer
from bench.voice import VoiceResult, measure_voice, run_voice_bench
from bench.voice_stats import TurnStats, VoiceLevelResult, summarize_voice_level

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
    "TurnRecord",
    "TurnStats",
    "TurnTimer",
    "VoiceConfig",
    "VoiceLevelResult",
    "VoiceResult",
    "add_bench_arguments",
    "bench_main",
    "build_payload",
    "config_from_args",
    "load_ladder",
    "make_prompt",
    "measure",
    "measure_voice",
    "playback_underruns",
    "plot_compare",
    "run_bench",
    "run_ladder",
    "run_voice_bench",
    "scheduled_underruns",
    "summarize_level",
    "summarize_voice_level",
]
