"""`voice-gateway bench` arguments and entry point: one sweep against a running server, a ladder
of servers (`--ladder`), or an overlay of earlier results (`--compare`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.config import SWEEP_KEYS, BenchConfig, BenchError
from bench.ladder import load_ladder, replot_ladder, run_ladder
from bench.plots import plot_compare
from bench.sweep import BenchResult, run_bench

log = logging.getLogger(__name__)
_DEFAULTS = BenchConfig()
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
    add("--rows", type=_csv(str), default=None, metavar="NAMES", help="with --ladder: run only these rows")
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
    opt("--voice", help=f"default {_DEFAULTS.voice}")
    opt("--seed", type=_at_least(0), help=f"default {_DEFAULTS.seed}")
    opt("--timeout", type=float, help=f"per-request timeout in seconds (default {_DEFAULTS.timeout:.0f})")
    opt("--client-processes", type=_at_least(1),
        help="spread each level's workers over this many client processes, each with its own event loop "
             f"(default {_DEFAULTS.client_processes})")
    opt("--input-audio", type=Path, metavar="WAV",
        help="a 16-bit PCM WAV, or a folder of them (e.g. benchmarks/voice): each request's user message is its "
             "--prompt-tokens text and then one of them as input_audio, in turn (--prompt-tokens 1: the text is "
             "only the request's index)")


def cli_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """The sweep flags given on the command line (the unset ones are absent)."""
    return {key: getattr(args, key) for key in SWEEP_KEYS if hasattr(args, key)}


def config_from_args(args: argparse.Namespace, argv: list[str]) -> BenchConfig:
    out_dir = args.out_dir or (_DEFAULT_OUT / args.ladder.stem if getattr(args, "ladder", None) else _DEFAULT_OUT)
    return BenchConfig(url=args.url, model=args.model, label=args.label or time.strftime("bench-%Y%m%d-%H%M%S"),
                       out_dir=Path(out_dir), argv=list(argv), **cli_sweep(args))


def _fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def print_summary(result: BenchResult, console: Console) -> None:
    table = Table(title=f"bench {result.label} ({result.config['model']})")
    for col in ("P", "C", "req/s", "refused", "fail", "TTFT mean/p99", "TTFP mean/p50/p99", "server TTFT/TTFP (from arrival)", "RTF mean/p99",
                "gap p99 ms", "audio s", "underruns", "client lag p99 ms"):
        table.add_column(col, justify="right")
    for lv in result.levels:
        table.add_row(str(lv.prompt_words), str(lv.concurrency), _fmt(lv.req_per_s, ".2f"), str(lv.refused),
                      str(lv.failures),
                      f"{_fmt(lv.ttft_s.mean)}/{_fmt(lv.ttft_s.p99)}",
                      f"{_fmt(lv.ttfp_s.mean)}/{_fmt(lv.ttfp_s.p50)}/{_fmt(lv.ttfp_s.p99)}",
                      f"{_fmt(lv.server_ttft_mean_s)}/{_fmt(lv.server_ttfp_mean_s)}"
                      f" ({_fmt(lv.server_http_ttft_mean_s)}/{_fmt(lv.server_http_ttfp_mean_s)})",
                      f"{_fmt(lv.rtf.mean)}/{_fmt(lv.rtf.p99)}", _fmt(lv.chunk_gap_ms.p99, ".0f"),
                      _fmt(lv.audio_s_mean, ".2f"), f"{lv.underruns} ({lv.underrun_requests} req)",
                      _fmt(lv.client_lag_ms.p99, ".1f"))
    console.print(table)


def print_ladder_summary(rows: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="ladder: each row at its highest concurrency")
    for col in ("row", "status", "P", "C", "req/s", "TTFP mean", "TTFP p99", "server TTFP", "RTF mean", "fail"):
        table.add_column(col, justify="left" if col in ("row", "status") else "right")
    for row in rows:
        top = max((lv["concurrency"] for lv in row["levels"]), default=None)
        status = row["status"] if row["status"] == "ok" else f"[red]{row['status']}[/]"
        shown = [lv for lv in row["levels"] if lv["concurrency"] == top]
        if not shown:
            table.add_row(row["name"], status, *["-"] * 8)
        for lv in shown:
            table.add_row(row["name"], status, str(lv["prompt_words"]), str(lv["concurrency"]),
                          _fmt(lv["req_per_s"], ".2f"), _fmt(lv["ttfp_s"]["mean"]), _fmt(lv["ttfp_s"]["p99"]),
                          _fmt(lv.get("server_ttfp_mean_s")), _fmt(lv["rtf"]["mean"]), str(lv["failures"]))
    console.print(table)


def bench_main(args: argparse.Namespace, argv: list[str]) -> int:
    """Exit code: 0 all requests (and rows) ok, 1 some failed, 2 could not run (no model / bad input)."""
    console = Console()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request drowns the progress bars
    if args.compare:
        try:
            png = plot_compare(list(args.compare), Path(args.out_dir or _DEFAULT_OUT) / "compare.png")
        except (OSError, ValueError, KeyError) as exc:
            log.error("cannot plot %s: %s", args.compare, exc)
            return 2
        console.print(f"wrote {png}")
        return 0
    config = config_from_args(args, argv)
    if args.ladder:
        try:
            ladder = load_ladder(args.ladder)
            if args.replot:
                rows = replot_ladder(ladder, config.out_dir, shlex.join(argv))
            else:
                rows = run_ladder(ladder, config, cli_sweep(args), config.out_dir,
                                  startup_timeout_s=args.startup_timeout, only=args.rows)
        except BenchError as exc:
            log.error("%s", exc)
            return 2
        print_ladder_summary(rows, console)
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
