"""`voice-gateway bench` arguments and entry point: one sweep against a running server, the realtime voice
benchmark (`--realtime`), a ladder of servers (`--ladder`), an overlay of earlier results (`--compare`),
or a soak (`bench soak`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.config import OUTPUT_FORMATS, SWEEP_KEYS, VOICE_MODES, BenchConfig, BenchError, VoiceConfig
from bench.image import check_image_spec
from bench.ladder import load_ladder, replot_ladder, run_ladder
from bench.phone import PhoneBenchConfig, run_phone_bench
from bench.plots import plot_compare
from bench.rounds import summarize_rounds
from bench.shrink import DEFAULT_RANGES, parse_ranges, summarize_file
from bench.soak import DEFAULT_MIX, SoakConfig, run_soak
from bench.summary import (
    print_ladder_summary,
    print_rounds_summary,
    print_soak_summary,
    print_summary,
    print_voice_summary,
)
from bench.sweep import run_bench
from bench.video import check_video_spec
from bench.voice import run_voice_bench

log = logging.getLogger(__name__)
_DEFAULTS = BenchConfig()
_VOICE = VoiceConfig()
# the sweep flags that mean the same for --realtime (its own defaults: VoiceConfig's)
_VOICE_SHARED = {"concurrency", "warmup", "max_tokens", "voice", "timeout", "client_processes", "spread_s", "image"}
_VOICE_KEYS = ("turns", "turn_mode", "output_format", "num_sessions", "questions", "chunk_ms", "input_speed",
               "think_s", "image_every", "time_limit_s", "retention_ratio")
_DEFAULT_OUT = Path("benchmarks/local")


def _csv(cast: Callable[[str], Any], allowed: set[Any] | None = None) -> Callable[[str], list[Any]]:
    """argparse type for comma lists, so bad values become usage errors rather than tracebacks."""
    def parse(text: str) -> list[Any]:
        try:
            values = [cast(v.strip()) for v in text.split(",") if v.strip()]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"bad list {text!r}") from exc
        if not values or (cast is int and min(values) < 1) or (allowed and not set(values) <= allowed):
            raise argparse.ArgumentTypeError(f"bad list {text!r}")
        return values
    return parse


def _at_least(lo: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from exc
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {value}")
        return value
    return parse


def _spec(check: Callable[[str], str]) -> Callable[[str], str]:
    """argparse type for --image and --video: a missing file or a malformed size is a usage error, not a
    traceback later."""
    def parse(text: str) -> str:
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc
    return parse


def _list(values: list[Any]) -> str:
    return ",".join(map(str, values))


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--url", default="http://127.0.0.1:8000", help="server base URL (one sweep)")
    add("--model", default=None, help="model id (default: first id from GET /v1/models)")
    add("--label", default=None, help="run name for {out-dir}/{label}.json/.png (default: timestamp)")
    add("--out-dir", type=Path, default=None,
        help=f"where results go (default {_DEFAULT_OUT}; with --ladder {_DEFAULT_OUT}/<ladder name>)")
    add("--compare", nargs="+", type=Path, metavar="JSON", default=None,
        help="only plot these bench JSONs into {out-dir}/compare.png; sends no traffic")
    add("--ladder", type=Path, metavar="YAML", default=None,
        help="start one server per row of this file, sweep each, write {out-dir}/<row>.json, ladder.json and figures")
    add("--rows", type=_csv(str), default=None, metavar="NAMES", help="with --ladder: run (or --replot) only these rows")
    add("--repeats", type=_at_least(1), default=None, metavar="N",
        help="with --ladder: N rounds of every row, in turn (default 1)")
    add("--held", action="store_true",
        help="with --ladder: start every row's server once, warm it with one unrecorded sweep and keep it for "
             "every round, paused (SIGSTOP, its whole process tree) while another row sweeps")
    add("--replot", action="store_true",
        help="with --ladder: no servers; rebuild ladder.json and the figures from the <row>.json files in --out-dir")
    add("--startup-timeout", type=float, default=900.0,
        help="with --ladder: seconds a row's server may take to answer /health (default 900)")
    # Sweep settings. Their defaults live in BenchConfig; a flag that is not given stays unset
    # (SUPPRESS) so that a ladder file's `bench:` settings can apply where the command line is silent.
    sweep = parser.add_argument_group("sweep (flags given here beat a ladder file's `bench:`; a row's `bench:` beats both)")
    opt = lambda *a, **k: sweep.add_argument(*a, default=argparse.SUPPRESS, **k)  # noqa: E731
    opt("--concurrency", type=_csv(int), help=f"comma list (default {_list(_DEFAULTS.concurrency)})")
    opt("--prompt-tokens", type=_csv(int),
        help=f"comma list of approximate prompt lengths in words; each (length, concurrency) pair is one "
             f"level (default {_list(_DEFAULTS.prompt_tokens)})")
    opt("--num-requests", type=_at_least(1), help="measured requests per level (default max(2*C, 4))")
    opt("--warmup", type=_at_least(0), help=f"unrecorded warm-up requests per level (default {_DEFAULTS.warmup})")
    opt("--max-tokens", type=_at_least(1), help=f"text tokens per reply, sent as max_tokens (default {_DEFAULTS.max_tokens})")
    opt("--modalities", type=_csv(str, {"text", "audio"}), help="text,audio (default) or text")
    opt("--voice", help="the voice replies speak in (default: the server's default voice)")
    opt("--seed", type=_at_least(0), help=f"default {_DEFAULTS.seed}")
    opt("--timeout", type=float, help=f"per-request timeout in seconds (default {_DEFAULTS.timeout:.0f})")
    opt("--client-processes", type=_at_least(1),
        help="spread each level's workers over this many client processes, each with its own event loop "
             f"(default {_DEFAULTS.client_processes})")
    opt("--spread-s", type=float, metavar="S",
        help="each worker's first request waits a random 0-S s, so that requests arrive steadily rather than "
             "in waves of C (default 0: all at once)")
    opt("--input-audio", type=Path, metavar="WAV",
        help="a 16-bit PCM WAV, or a folder of them (e.g. benchmarks/voice): each request's user message is its "
             "--prompt-tokens text and then one of them as input_audio, in turn (--prompt-tokens 1: the text is "
             "only the request's index)")
    opt("--image", type=_spec(check_image_spec), metavar="PATH|WxH",
        help="a PNG, JPEG or WebP file, or WxH (e.g. 1280x720) for synthetic camera-like JPEGs (quality 85, one "
             "room, every frame its own sensor noise: a distinct picture for each request or turn, up to 256 a run, "
             "the same for the same size): each request's user message carries one as an image_url part before its "
             "text; with --realtime each turn sends one as an input_image user item before its question")
    opt("--video", type=_spec(check_video_spec), metavar="PATH|WxHxS",
        help="chat only: an MP4 or WebM file, or WxHxS (e.g. 640x360x4) for a synthetic clip of that size and "
             "length in seconds (shapes moving over a gradient, 10 frames a second, H.264 in MP4, the same for the "
             "same spec): each request's user message carries it as a video_url part before its text, after "
             "--image's picture")

    voice = parser.add_argument_group(
        "realtime (--realtime: spoken turns over WS /v1/realtime; it also takes --concurrency, default "
        f"{_list(_VOICE.concurrency)}, and --warmup (one-turn sessions), --max-tokens, --voice, --timeout (per "
        "turn), --client-processes, --image)")
    add("--realtime", action="store_true",
        help="run the realtime voice benchmark: C conversations at a time, each of --turns spoken questions")
    vopt = lambda *a, **k: voice.add_argument(*a, default=argparse.SUPPRESS, **k)  # noqa: E731
    vopt("--turns", type=_at_least(1), help=f"questions per conversation (default {_VOICE.turns})")
    vopt("--turn-mode", type=_csv(str, set(VOICE_MODES)),
         help="commit (the client commits and calls response.create), vad (server VAD ends the turn), or both "
              f"(default {_list(_VOICE.turn_mode)})")
    vopt("--output-format", type=_csv(str, set(OUTPUT_FORMATS)),
         help=f"pcm16 (audio deltas), opus (binary packets), or both (default {_list(_VOICE.output_format)})")
    vopt("--num-sessions", type=_at_least(1), help="conversations per level (default C: one per worker)")
    vopt("--questions", type=Path, metavar="WAV",
         help=f"a 16-bit PCM WAV or a folder of them (default {_VOICE.questions})")
    vopt("--chunk-ms", type=_at_least(10), help=f"audio per append (default {_VOICE.chunk_ms})")
    vopt("--input-speed", type=float,
         help=f"how many times real time the questions are sent and the replies listened to before the next "
              f"question (default {_VOICE.input_speed:g}: a microphone and a listener)")
    vopt("--think-s", type=float, metavar="S",
         help="before each turn after the first, the user pauses a random 0-S s (at --input-speed), so that "
              "conversations of like turns do not fall into step (default 0: the next question at once)")
    vopt("--time-limit", dest="time_limit_s", type=float, metavar="S",
         help="end each level after S s: its conversations start no turn after that, the turns under way end, and "
              "the result counts the turns not started (default 0: every turn)")
    vopt("--retention-ratio", type=float, metavar="R",
         help="each session's truncation: keep R (0-1) of the context at a cut (default: the server's auto)")
    vopt("--image-every", type=_at_least(1), metavar="N",
         help="with --image: turn t of a conversation sends the picture when t %% N == 0 (default 1: every turn, "
              "a camera frame with each question)")
    add("--phone", action="store_true",
        help="simulated phone calls (Twilio Media Streams) against --url: C calls at a time (--concurrency, "
             "default 1,4), each of --turns spoken questions; end of speech -> first reply audio at the phone")
    add("--twilio-auth-token", default=os.environ.get("VOICE_GATEWAY_TWILIO_AUTH_TOKEN", ""),
        help="with --phone: the server's Twilio auth token, which the bench signs its webhooks with "
             "(default: VOICE_GATEWAY_TWILIO_AUTH_TOKEN)")
    modes = parser.add_subparsers(dest="mode", metavar="soak")
    add_soak_arguments(modes.add_parser("soak", help="mixed traffic for a long while, sampling the server's memory "
                                        "and open files"))
    add_summarize_arguments(modes.add_parser("summarize", help="a long realtime run's JSON as benchmarks/ keeps it: "
                                             "without its records, with statistics per range of turns"))


_SOAK = SoakConfig()


def _mix(text: str) -> dict[str, int]:
    try:
        mix = {kind.strip(): int(share) for kind, _, share in (item.partition("=") for item in text.split(","))}
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad mix {text!r}: kind=share,...") from exc
    if unknown := set(mix) - set(DEFAULT_MIX):
        raise argparse.ArgumentTypeError(f"unknown kinds {sorted(unknown)}; known: {', '.join(DEFAULT_MIX)}")
    return mix


def add_soak_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("serve", nargs=argparse.REMAINDER, metavar="-- SERVE_ARGS",
        help="start `voice-gateway serve SERVE_ARGS` on a free loopback port and soak it "
             f"(default: {shlex.join(_SOAK.serve_args)})")
    add("--url", default=None, help="soak this running server instead (needs --pid)")
    add("--pid", type=_at_least(1), default=None, help="with --url: the server's process, whose tree is sampled")
    add("--requests", type=_at_least(1), default=_SOAK.requests, help=f"default {_SOAK.requests}")
    add("--concurrency", type=_at_least(1), default=_SOAK.concurrency, help=f"default {_SOAK.concurrency}")
    add("--max-tokens", type=_at_least(1), default=_SOAK.max_tokens, help=f"text tokens per reply (default {_SOAK.max_tokens})")
    add("--mix", type=_mix, default=_SOAK.mix, metavar="KIND=SHARE,...",
        help="shares of the request kinds; kinds not named are not sent (default " + ",".join(f"{k}={v}" for k, v in DEFAULT_MIX.items()) + ")")
    add("--timeout", type=float, default=_SOAK.timeout_s, help=f"per request, seconds (default {_SOAK.timeout_s:g})")
    add("--sample-every", type=float, default=_SOAK.sample_every_s, help=f"seconds (default {_SOAK.sample_every_s:g})")
    add("--settle", type=float, default=_SOAK.settle_s,
        help=f"seconds between the last request and the last sample (default {_SOAK.settle_s:g})")
    add("--seed", type=_at_least(0), default=_SOAK.seed, help="the request order's seed (default 0)")
    add("--label", default=_SOAK.label, help=f"{{out-dir}}/{{label}}.json and .png (default {_SOAK.label})")
    add("--out-dir", type=Path, default=_DEFAULT_OUT / "soak", help=f"default {_DEFAULT_OUT / 'soak'}")


def add_summarize_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path, metavar="RUN.json", help="a `bench --realtime` result")
    parser.add_argument("--of", required=True, metavar="COMMIT:PATH",
                        help="where the whole run is kept in the history, written into the summary (`summary_of`)")
    parser.add_argument("--ranges", type=parse_ranges, default=DEFAULT_RANGES, metavar="A-B,...",
                        help="ranges of turns, 1-based (default " + ",".join(f"{a}-{b}" for a, b in DEFAULT_RANGES)
                             + ", those the run reached)")
    parser.add_argument("summary", type=Path, nargs="?", default=None, metavar="SUMMARY.json",
                        help="where to write it (default: RUN-summary.json beside the run)")


def summarize_main(args: argparse.Namespace, console: Console) -> int:
    try:
        path = summarize_file(args.run, args.of, args.ranges, args.summary)
    except BenchError as exc:
        log.error("%s", exc)
        return 2
    console.print(f"wrote {path}")
    return 0


def _serve_args(remainder: list[str]) -> list[str]:
    args = remainder[1:] if remainder[:1] == ["--"] else remainder
    return args or list(_SOAK.serve_args)


def soak_main(args: argparse.Namespace, argv: list[str], console: Console) -> int:
    if args.url is not None and args.pid is None:
        log.error("--url needs --pid: the soak samples the server's processes")
        return 2
    config = SoakConfig(url=args.url or _SOAK.url, pid=args.pid, serve_args=_serve_args(args.serve),
                        requests=args.requests, concurrency=args.concurrency, max_tokens=args.max_tokens,
                        timeout_s=args.timeout, sample_every_s=args.sample_every, settle_s=args.settle,
                        seed=args.seed, mix=args.mix, label=args.label, out_dir=args.out_dir, argv=list(argv))
    try:
        result = run_soak(config)
    except BenchError as exc:
        log.error("%s", exc)
        return 2
    print_soak_summary(config.label, result["summary"], console)
    console.print(f"wrote {config.out_dir / config.label}.json and .png")
    return 1 if result["summary"]["failed"] else 0


def cli_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """The sweep flags given on the command line (the unset ones are absent)."""
    return {key: getattr(args, key) for key in SWEEP_KEYS if hasattr(args, key)}


def config_from_args(args: argparse.Namespace, argv: list[str]) -> BenchConfig:
    out_dir = args.out_dir or (_DEFAULT_OUT / args.ladder.stem if getattr(args, "ladder", None) else _DEFAULT_OUT)
    return BenchConfig(url=args.url, model=args.model, label=args.label or time.strftime("bench-%Y%m%d-%H%M%S"),
                       out_dir=Path(out_dir), argv=list(argv), **cli_sweep(args))


def voice_config_from_args(args: argparse.Namespace, argv: list[str]) -> VoiceConfig:
    if chat_only := [key for key in cli_sweep(args) if key not in _VOICE_SHARED]:
        raise BenchError(f"--realtime does not take {', '.join(_flag(k) for k in chat_only)}")
    given = cli_sweep(args)
    given |= {key: getattr(args, key) for key in _VOICE_KEYS if hasattr(args, key)}
    return VoiceConfig(url=args.url, model=args.model, label=args.label or time.strftime("voice-%Y%m%d-%H%M%S"),
                       out_dir=Path(args.out_dir or _DEFAULT_OUT), argv=list(argv), **given)


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def bench_main(args: argparse.Namespace, argv: list[str]) -> int:
    """Exit code: 0 all requests (and rows) ok, 1 some failed, 2 could not run (no model / bad input)."""
    console = Console()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request drowns the progress bars
    if getattr(args, "mode", None) == "soak":
        return soak_main(args, argv, console)
    if getattr(args, "mode", None) == "summarize":
        return summarize_main(args, console)
    if args.compare:
        try:
            png = plot_compare(list(args.compare), Path(args.out_dir or _DEFAULT_OUT) / "compare.png")
        except (OSError, ValueError, KeyError) as exc:
            log.error("cannot plot %s: %s", args.compare, exc)
            return 2
        console.print(f"wrote {png}")
        return 0
    if args.realtime:
        return _realtime_main(args, argv, console)
    if args.phone:
        return _phone_main(args, argv, console)
    if voice_only := [key for key in _VOICE_KEYS if hasattr(args, key)]:
        log.error("%s: only with --realtime", ", ".join(_flag(key) for key in voice_only))
        return 2
    config = config_from_args(args, argv)
    if args.ladder:
        try:
            ladder = load_ladder(args.ladder)
            if args.replot:
                rounds = replot_ladder(ladder, config.out_dir, shlex.join(argv), only=args.rows)
            else:
                rounds = run_ladder(ladder, config, cli_sweep(args), config.out_dir,
                                    startup_timeout_s=args.startup_timeout, only=args.rows, repeats=args.repeats,
                                    held=args.held)
        except BenchError as exc:
            log.error("%s", exc)
            return 2
        rows = [row for rnd in rounds for row in rnd]
        print_ladder_summary(rounds[0], console)
        if len(rounds) > 1:
            print_rounds_summary(summarize_rounds(rounds), console)
        console.print(f"wrote {config.out_dir / 'ladder.json'} and its figures")
        ok = all(r["status"] == "ok" and not any(lv["failures"] for lv in r["levels"]) for r in rows)
        return 0 if ok else 1
    try:
        result = asyncio.run(run_bench(config))
    except BenchError as exc:
        log.error("%s", exc)
        return 2
    print_summary(result, console)
    return 1 if any(lv.failures for lv in result.levels) else 0


def _phone_main(args: argparse.Namespace, argv: list[str], console: Console) -> int:
    cfg = PhoneBenchConfig(url=args.url, auth_token=args.twilio_auth_token, argv=list(argv),
                           out=(args.out_dir or _DEFAULT_OUT) / f"{args.label or 'phone'}.json")
    if hasattr(args, "concurrency"):
        cfg.concurrency = args.concurrency
    if hasattr(args, "turns"):
        cfg.turns = args.turns
    if hasattr(args, "questions"):
        cfg.questions = args.questions
    try:
        result = asyncio.run(run_phone_bench(cfg))
    except BenchError as exc:
        log.error("%s", exc)
        return 2
    for level in result["levels"]:
        console.print({k: v for k, v in level.items() if k != "records"})
    console.print(f"wrote {cfg.out}")
    return 0 if all(lv["answered"] == lv["turns"] for lv in result["levels"]) else 1


def _realtime_main(args: argparse.Namespace, argv: list[str], console: Console) -> int:
    if args.ladder:
        log.error("--realtime runs against one server (--url), not a --ladder")
        return 2
    try:
        result = asyncio.run(run_voice_bench(voice_config_from_args(args, argv)))
    except BenchError as exc:
        log.error("%s", exc)
        return 2
    print_voice_summary(result, console)
    return 1 if any(lv.overall.failures for lv in result.levels) else 0
