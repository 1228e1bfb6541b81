"""Load generator behind `voice-gateway bench`: drives a live server's streaming
/v1/chat/completions at several concurrency levels, measures client-side TTFT, TTFP, RTF and
playback underruns, and writes ``{out_dir}/{label}.json`` plus a ``{label}.png`` plot."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from itertools import cycle, islice
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

log = logging.getLogger(__name__)

SAMPLE_RATE = 24_000
BYTES_PER_SAMPLE = 2
SCHEMA_VERSION = 1
_FILLER = ("please describe in a warm spoken style how a lighthouse keeper spends a stormy "
           "night on a small island and what sounds she hears until dawn").split()


class BenchError(RuntimeError):
    """Setup problem that makes a run meaningless (e.g. no model to target)."""


class ServerStreamError(ValueError):
    """The server sent an OpenAI error object inside the SSE stream (counts as a failure)."""


@dataclass
class BenchConfig:
    url: str = "http://127.0.0.1:8000"
    model: str | None = None  # None: first id from GET /v1/models
    concurrency: list[int] = field(default_factory=lambda: [1, 4, 8])
    num_requests: int | None = None  # None: max(2*C, 4) per level
    warmup: int = 1
    prompt_tokens: int = 16
    max_tokens: int = 256
    modalities: list[str] = field(default_factory=lambda: ["text", "audio"])
    voice: str = "ethan"
    seed: int | None = 0  # fixed seed keeps outputs identical across runs being compared
    label: str = "bench"
    out_dir: Path = Path("benchmarks/local")
    timeout: float = 300.0
    argv: list[str] = field(default_factory=list)  # exact command line, stored verbatim
    show_progress: bool = True


@dataclass
class RequestRecord:
    index: int
    concurrency: int
    ok: bool = False
    error: str | None = None
    status: int | None = None
    ttft_s: float | None = None
    ttfp_s: float | None = None
    latency_s: float | None = None
    rtf: float | None = None
    audio_s: float = 0.0
    finish_reason: str | None = None
    completion_tokens: int | None = None
    audio_frames: int | None = None  # usage.completion_tokens_details.audio_tokens
    chunk_gaps_ms: list[float] = field(default_factory=list)
    underruns: int = 0
    stall_ms: float = 0.0


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
        return cls(float(arr.mean()), float(np.percentile(arr, 50)), float(np.percentile(arr, 99)))


@dataclass
class LevelResult:
    concurrency: int
    num_requests: int
    completed: int
    failures: int
    wall_s: float
    req_per_s: float
    ttft_s: Stat
    ttfp_s: Stat
    rtf: Stat
    latency_s: Stat
    audio_s_mean: float | None
    underruns: int
    stall_ms_mean: float | None
    chunk_gap_ms_p99: float | None
    records: list[RequestRecord]


@dataclass
class BenchResult:  # serialized as-is (plus schema_version) to {label}.json
    label: str
    created: str
    command: str
    config: dict[str, Any]
    machine: dict[str, Any]
    server_models: dict[str, Any] | None
    levels: list[LevelResult]



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
    if not arrivals:
        return 0, 0.0
    play_until = arrivals[0][0] + arrivals[0][1]
    count, stall = 0, 0.0
    for t, dur in arrivals[1:]:
        if t > play_until:  # buffer ran dry before this chunk arrived
            count, stall = count + 1, stall + (t - play_until)
            play_until = t
        play_until += dur
    return count, stall * 1000.0


class StreamTimer:
    """Folds one response's timestamped SSE events into its RequestRecord."""

    def __init__(self, record: RequestRecord, t_send: float) -> None:
        self.record, self.t_send = record, t_send
        self.done = False
        self._t_last: float | None = None
        self._arrivals: list[tuple[float, float]] = []

    def on_data(self, data: str, now: float) -> None:
        t = now - self.t_send
        if data.strip() == "[DONE]":
            self.done, self._t_last = True, t
            return
        chunk = json.loads(data)
        if "error" in chunk:
            raise ServerStreamError(_error_text(chunk))
        rec = self.record
        if self._t_last is not None:
            rec.chunk_gaps_ms.append((t - self._t_last) * 1000.0)
        self._t_last = t
        choice = (chunk.get("choices") or [{}])[0]
        delta = choice.get("delta") or {}
        audio = delta.get("audio") or {}
        # With audio on, OpenAI streams the text as the audio's transcript instead of `content`.
        if (delta.get("content") or audio.get("transcript")) and rec.ttft_s is None:
            rec.ttft_s = t
        if b64 := audio.get("data"):
            self._arrivals.append((t, len(base64.b64decode(b64)) / BYTES_PER_SAMPLE / SAMPLE_RATE))
            rec.ttfp_s = t if rec.ttfp_s is None else rec.ttfp_s
        rec.finish_reason = choice.get("finish_reason") or rec.finish_reason
        if usage := chunk.get("usage"):
            rec.completion_tokens = usage.get("completion_tokens")
            rec.audio_frames = (usage.get("completion_tokens_details") or {}).get("audio_tokens")

    def finish(self, now: float) -> None:
        rec = self.record
        rec.latency_s = self._t_last if self.done else now - self.t_send
        rec.audio_s = sum(d for _, d in self._arrivals)
        if rec.audio_s > 0:
            rec.rtf = self._arrivals[-1][0] / rec.audio_s
        rec.underruns, rec.stall_ms = playback_underruns(self._arrivals)


def _error_text(body: Any) -> str:
    """Best-effort message from an OpenAI ``{"error": {...}}`` body (dict or raw bytes)."""
    try:
        body = json.loads(body) if isinstance(body, bytes) else body
        err = body["error"]
        return str(err.get("message") or err if isinstance(err, dict) else err)[:500]
    except (ValueError, TypeError, KeyError):
        return repr(body)[:500]


def make_prompt(n_words: int, index: int) -> str:
    # The index prefix varies prompts so a prefix cache cannot serve every request.
    return " ".join([f"#{index}", *islice(cycle(_FILLER), max(n_words - 1, 0))])


def build_payload(config: BenchConfig, model: str, index: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": make_prompt(config.prompt_tokens, index)}],
        "modalities": list(config.modalities),
        "stream": True,
        "max_tokens": config.max_tokens,
        "stream_options": {"include_usage": True},
    }
    if "audio" in config.modalities:
        body["audio"] = {"voice": config.voice, "format": "pcm16"}
    if config.seed is not None:
        body["seed"] = config.seed
    return body


async def one_request(client: httpx.AsyncClient, config: BenchConfig, model: str,
                      index: int, concurrency: int) -> RequestRecord:
    rec = RequestRecord(index=index, concurrency=concurrency)
    decoder = SSEDecoder()
    t_send = time.perf_counter()
    timer = StreamTimer(rec, t_send)
    try:
        async with client.stream("POST", "/v1/chat/completions",
                                 json=build_payload(config, model, index)) as resp:
            rec.status = resp.status_code
            if resp.status_code >= 400:
                rec.error = f"HTTP {resp.status_code}: {_error_text(await resp.aread())}"
                return rec
            async for line in resp.aiter_lines():
                if (data := decoder.feed(line)) is not None:
                    timer.on_data(data, time.perf_counter())
            if (data := decoder.flush()) is not None:
                timer.on_data(data, time.perf_counter())
        timer.finish(time.perf_counter())
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as exc:
        # One broken response must not abort the level: record it as a failure.
        rec.error = f"{type(exc).__name__}: {exc}"
        return rec
    rec.ok = timer.done
    rec.error = None if timer.done else "stream ended without data: [DONE]"
    return rec


async def _run_pool(client: httpx.AsyncClient, config: BenchConfig, model: str, workers: int,
                    indices: Iterable[int], concurrency: int,
                    on_done: Callable[[], None]) -> list[RequestRecord]:
    pending = iter(indices)  # shared: each worker pulls the next index when it becomes free
    records: list[RequestRecord] = []

    async def worker() -> None:
        for index in pending:
            records.append(await one_request(client, config, model, index, concurrency))
            on_done()

    await asyncio.gather(*(worker() for _ in range(workers)))
    return sorted(records, key=lambda r: r.index)


def summarize_level(concurrency: int, records: list[RequestRecord], wall_s: float) -> LevelResult:
    ok = [r for r in records if r.ok]
    gaps = [g for r in ok for g in r.chunk_gaps_ms]
    return LevelResult(
        concurrency=concurrency, num_requests=len(records), completed=len(ok),
        failures=len(records) - len(ok), wall_s=wall_s,
        req_per_s=len(ok) / wall_s if wall_s > 0 else 0.0,
        ttft_s=Stat.of(r.ttft_s for r in ok), ttfp_s=Stat.of(r.ttfp_s for r in ok),
        rtf=Stat.of(r.rtf for r in ok), latency_s=Stat.of(r.latency_s for r in ok),
        audio_s_mean=float(np.mean([r.audio_s for r in ok])) if ok else None,
        underruns=sum(r.underruns for r in ok),
        stall_ms_mean=float(np.mean([r.stall_ms for r in ok])) if ok else None,
        chunk_gap_ms_p99=float(np.percentile(gaps, 99)) if gaps else None,
        records=records,
    )


async def run_level(client: httpx.AsyncClient, config: BenchConfig, model: str,
                    concurrency: int, progress: Progress) -> LevelResult:
    n = config.num_requests or max(2 * concurrency, 4)
    task = progress.add_task(f"C={concurrency}", total=config.warmup + n)
    advance = lambda: progress.advance(task)  # noqa: E731
    warm = await _run_pool(client, config, model, max(min(concurrency, config.warmup), 1),
                           range(-config.warmup, 0), concurrency, advance)
    if failed := [r.error for r in warm if not r.ok]:
        log.warning("%d warm-up request(s) failed at C=%d: %s", len(failed), concurrency, failed[0])
    t0 = time.perf_counter()
    records = await _run_pool(client, config, model, concurrency, range(n), concurrency, advance)
    return summarize_level(concurrency, records, time.perf_counter() - t0)


async def fetch_models(client: httpx.AsyncClient) -> dict[str, Any] | None:
    try:
        resp = await client.get("/v1/models")
        resp.raise_for_status()
        return resp.json()
    except (httpx.HTTPError, ValueError) as exc:
        log.warning("GET /v1/models failed: %s", exc)
        return None


def machine_info() -> dict[str, Any]:
    # Deliberately no hostname (platform.node()): results get committed and shared.
    return {"platform": platform.platform(), "machine": platform.machine(),
            "processor": platform.processor(), "cpu_count": os.cpu_count(),
            "python": sys.version.split()[0], "implementation": platform.python_implementation(),
            "httpx": httpx.__version__}


async def run_bench(config: BenchConfig) -> BenchResult:
    # trust_env=False: proxies from the environment would distort latency numbers.
    async with httpx.AsyncClient(base_url=config.url.rstrip("/"), timeout=config.timeout,
                                 limits=httpx.Limits(max_connections=max(config.concurrency)),
                                 trust_env=False) as client:
        models = await fetch_models(client)
        ids = [m.get("id") for m in (models or {}).get("data") or [] if isinstance(m, dict)]
        model = config.model or next((i for i in ids if i), None)
        if model is None:
            raise BenchError(f"no --model given and {config.url}/v1/models listed none")
        levels = []
        with Progress(console=Console(stderr=True), disable=not config.show_progress) as progress:
            for concurrency in config.concurrency:
                levels.append(await run_level(client, config, model, concurrency, progress))
    cfg = asdict(replace(config, model=model))
    for key in ("argv", "show_progress"):
        cfg.pop(key)
    result = BenchResult(label=config.label, created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         command=shlex.join(config.argv), config=cfg, machine=machine_info(),
                         server_models=models, levels=levels)
    write_outputs(result, Path(config.out_dir))
    return result


def run_bench_sync(config: BenchConfig) -> BenchResult:
    return asyncio.run(run_bench(config))


def write_outputs(result: BenchResult, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out_dir / f"{result.label}.json", out_dir / f"{result.label}.png"
    payload = {"schema_version": SCHEMA_VERSION, **asdict(result)}
    json_path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    levels = [asdict(lv) for lv in result.levels]
    _plot_runs([(result.label, levels)], png_path, title=f"voice-gateway bench: {result.label}")
    log.info("wrote %s and %s", json_path, png_path)
    return json_path, png_path


_PANELS = (("ttfp_s", "TTFP (s)", "time to first audio"),
           ("rtf", "RTF", "real-time factor (< 1 keeps up)"),
           ("req_per_s", "req/s", "throughput"))


def _plot_runs(runs: list[tuple[str, list[dict[str, Any]]]], out_png: Path, title: str) -> Path:
    # Imported lazily and via Figure + FigureCanvasAgg: no pyplot, so no global backend state,
    # and the CLI does not pay matplotlib's import cost unless it plots.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    for i, (label, levels) in enumerate(runs):
        color, xs = f"C{i % 10}", [lv["concurrency"] for lv in levels]
        for ax, (key, _, _) in zip(axes, _PANELS):
            if key == "req_per_s":
                ax.plot(xs, [lv[key] for lv in levels], "o-", color=color, label=label)
                continue
            for pct, style in (("p50", "o-"), ("p99", "x--")):
                ys = [np.nan if lv[key][pct] is None else lv[key][pct] for lv in levels]
                ax.plot(xs, ys, style, color=color, label=f"{label} {pct}")
    axes[1].axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ticks = sorted({lv["concurrency"] for _, levels in runs for lv in levels})
    for ax, (_, ylabel, subtitle) in zip(axes, _PANELS):
        ax.set(xlabel="concurrency", ylabel=ylabel, title=subtitle, xticks=ticks)
        ax.grid(True, alpha=0.3)
        if runs:
            ax.legend(fontsize="small")
    fig.suptitle(title)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    return out_png


def plot_compare(json_paths: list[Path], out_png: Path) -> Path:
    """Overlay several bench JSONs (e.g. async chunk on vs off) on the same three panels."""
    runs = []
    for path in json_paths:
        data = json.loads(Path(path).read_text())
        runs.append((str(data.get("label") or Path(path).stem), data["levels"]))
    return _plot_runs(runs, out_png, title="voice-gateway bench: " + " vs ".join(r[0] for r in runs))


def print_summary(result: BenchResult, console: Console) -> None:
    table = Table(title=f"bench {result.label} ({result.config['model']})")
    for col in ("C", "req/s", "fail", "TTFT p50/p99", "TTFP p50/p99", "RTF p50/p99", "audio s", "underruns"):
        table.add_column(col, justify="right")
    fmt = lambda v, spec=".3f": "-" if v is None else format(v, spec)  # noqa: E731
    for lv in result.levels:
        table.add_row(str(lv.concurrency), fmt(lv.req_per_s, ".2f"), str(lv.failures),
                      *(f"{fmt(s.p50)}/{fmt(s.p99)}" for s in (lv.ttft_s, lv.ttfp_s, lv.rtf)),
                      fmt(lv.audio_s_mean, ".2f"), str(lv.underruns))
    console.print(table)


def _csv(cast: Callable[[str], Any], allowed: set[Any] | None = None) -> Callable[[str], list[Any]]:
    """argparse type for comma lists, so bad values become usage errors rather than tracebacks."""
    def parse(text: str) -> list[Any]:
        try:
            values = [cast(v.strip()) for v in text.split(",") if v.strip()]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"bad list {text!r}") from exc
        if not values or (allowed is None and min(values) < 1) or (allowed and not set(values) <= allowed):
            raise argparse.ArgumentTypeError(f"bad list {text!r}")
        return values
    return parse


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--url", default="http://127.0.0.1:8000", help="server base URL")
    add("--model", default=None, help="model id (default: first id from GET /v1/models)")
    add("--concurrency", type=_csv(int), default=[1, 4, 8], help="comma list, e.g. 1,4,8")
    add("--num-requests", type=int, default=None, help="requests per level (default max(2*C, 4))")
    add("--warmup", type=int, default=1, help="unrecorded warm-up requests per level")
    add("--prompt-tokens", type=int, default=16, help="approximate prompt length in words")
    add("--max-tokens", type=int, default=256)
    add("--modalities", type=_csv(str, {"text", "audio"}), default=["text", "audio"],
        help="text,audio or text")
    add("--seed", type=int, default=0)
    add("--label", default=None, help="run name for {out-dir}/{label}.json/.png (default: timestamp)")
    add("--out-dir", type=Path, default=Path("benchmarks/local"))
    add("--compare", nargs="+", type=Path, metavar="JSON", default=None,
        help="only plot these bench JSONs into {out-dir}/compare.png; sends no traffic")
    add("--timeout", type=float, default=300.0, help="per-request timeout in seconds")


def config_from_args(args: argparse.Namespace, argv: list[str]) -> BenchConfig:
    return BenchConfig(url=args.url, model=args.model, concurrency=args.concurrency,
                       num_requests=args.num_requests, warmup=args.warmup,
                       prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens,
                       modalities=args.modalities, seed=args.seed,
                       label=args.label or time.strftime("bench-%Y%m%d-%H%M%S"),
                       out_dir=Path(args.out_dir), timeout=args.timeout, argv=list(argv))


def bench_main(args: argparse.Namespace, argv: list[str]) -> int:
    """Exit code: 0 all requests ok, 1 some failed, 2 could not run (no model / bad input)."""
    if args.compare:
        try:
            png = plot_compare(list(args.compare), Path(args.out_dir) / "compare.png")
        except (OSError, ValueError, KeyError) as exc:
            log.error("cannot plot %s: %s", args.compare, exc)
            return 2
        Console().print(f"wrote {png}")
        return 0
    try:
        result = run_bench_sync(config_from_args(args, argv))
    except BenchError as exc:
        log.error("%s", exc)
        return 2
    print_summary(result, Console())
    return 1 if any(lv.failures for lv in result.levels) else 0
