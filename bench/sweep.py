"""The sweep: drives a live server's streaming /v1/chat/completions at each (prompt length,
concurrency) level, warm-up first, and writes ``{out_dir}/{label}.json`` plus a ``{label}.png``."""

from __future__ import annotations

import asyncio
import base64
import logging
import random
import shlex
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, replace
from itertools import cycle, islice
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import Progress

from bench.config import BenchConfig, BenchError
from bench.image import BenchImage, ImageInfo, load_image
from bench.machine import machine_info
from bench.measure import RequestRecord, SSEDecoder, StreamTimer, error_text
from bench.plots import plot_runs
from bench.processes import Started, run_in_processes
from bench.result_file import write_json
from bench.server_metrics import (
    CROSSING,
    IMAGE_DECODE,
    VISION_TOWER,
    count_between,
    first_packet_parts,
    server_latency_sums,
    step_shares,
)
from bench.speech import load_questions
from bench.stats import LevelResult, Stat, summarize_level
from bench.video import BenchVideo, VideoInfo, load_video

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2  # 2: prompt-length levels, audio-only chunk gaps as a Stat, token means
_FILLER = ("please describe in a warm spoken style how a lighthouse keeper spends a stormy "
           "night on a small island and what sounds she hears until dawn").split()


@dataclass
class BenchResult:  # serialized as-is (plus schema_version) to {label}.json
    label: str
    created: str
    command: str
    config: dict[str, Any]
    machine: dict[str, Any]
    server_models: dict[str, Any] | None
    levels: list[LevelResult]
    image: ImageInfo | None = None  # the pictures the requests carried (--image)
    video: VideoInfo | None = None  # the clip every request carried (--video)


@dataclass(frozen=True, slots=True)
class RequestMedia:
    """What a request's user message carries besides its text; read or made once, before any clock starts."""

    input_audio: tuple[str, ...] = ()  # base64 WAV files: request i carries file i % count
    image_urls: tuple[str, ...] = ()  # the run's pictures (bench/image.py): each request one, in turn
    first_image: int = 0  # the picture of this level's first warm-up request
    video_url: str | None = None  # one data URL, the same in every request

    def image_url(self, index: int, warmup: int) -> str | None:
        """Request `index`'s picture (warm-ups are -warmup..-1): the run's pictures in order, level after level."""
        return self.image_urls[(self.first_image + warmup + index) % len(self.image_urls)] if self.image_urls else None


def read_image(spec: str | None, pictures: int = 1) -> BenchImage | None:
    """The run's --image, once, as `pictures` distinct ones where it is synthetic; BenchError (the run cannot start)
    if it cannot be read."""
    try:
        return None if spec is None else load_image(spec, pictures)
    except ValueError as exc:
        raise BenchError(f"--image {exc}") from exc


def read_video(spec: str | None) -> BenchVideo | None:
    """The run's --video, once; BenchError (the run cannot start) if it cannot be read."""
    try:
        return None if spec is None else load_video(spec)
    except ValueError as exc:
        raise BenchError(f"--video {exc}") from exc


def make_prompt(n_words: int, index: int) -> str:
    # The index prefix varies prompts so a prefix cache cannot serve every request.
    return " ".join([f"#{index}", *islice(cycle(_FILLER), max(n_words - 1, 0))])


def build_payload(config: BenchConfig, model: str, index: int, prompt_words: int,
                  input_audio: Sequence[str] = (), image_url: str | None = None,
                  video_url: str | None = None) -> dict[str, Any]:
    """The request body; with `input_audio` (base64 WAV files) the user message is the prompt's text, then
    file `index % len(input_audio)` as an `input_audio` part; with `image_url` and `video_url` (data URLs) an
    `image_url` part and then a `video_url` part (vLLM's extension) come first, as a user shows what they ask
    about."""
    text = make_prompt(prompt_words, index)
    shown = [{"type": "image_url", "image_url": {"url": image_url}}] if image_url else []
    shown += [{"type": "video_url", "video_url": {"url": video_url}}] if video_url else []
    parts: list[dict[str, Any]] = [*shown, {"type": "text", "text": text}]
    if input_audio:
        audio = {"data": input_audio[index % len(input_audio)], "format": "wav"}
        parts.append({"type": "input_audio", "input_audio": audio})
    content = parts if len(parts) > 1 else text  # text alone stays a plain string, as most clients send it
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "modalities": list(config.modalities),
        "stream": True,
        "max_tokens": config.max_tokens,
        "stream_options": {"include_usage": True},
    }
    if "audio" in config.modalities:
        body["audio"] = {"format": "pcm16"} | ({"voice": config.voice} if config.voice else {})
    if config.seed is not None:
        body["seed"] = config.seed
    return body


async def one_request(client: httpx.AsyncClient, config: BenchConfig, model: str, index: int, concurrency: int,
                      prompt_words: int, media: RequestMedia) -> RequestRecord:
    rec = RequestRecord(index=index, concurrency=concurrency, prompt_words=prompt_words)
    decoder = SSEDecoder()
    payload = build_payload(config, model, index, prompt_words, media.input_audio,
                            media.image_url(index, config.warmup), media.video_url)
    t_send = time.perf_counter()
    timer = StreamTimer(rec, t_send)
    try:
        async with client.stream("POST", "/v1/chat/completions", json=payload) as resp:
            rec.headers_s = time.perf_counter() - t_send
            rec.status = resp.status_code
            if resp.status_code >= 400:
                rec.error = f"HTTP {resp.status_code}: {error_text(await resp.aread())}"
                if resp.status_code in (429, 503):
                    rec.retry_after_s = _seconds(resp.headers.get("retry-after"))
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


def _seconds(retry_after: str | None) -> float:
    try:
        return max(0.0, float(retry_after or 1))
    except ValueError:  # an HTTP date: not what this server sends
        return 1.0


async def _run_pool(clients: list[httpx.AsyncClient], config: BenchConfig, model: str,
                    indices: Iterable[int], concurrency: int, prompt_words: int, media: RequestMedia,
                    on_done: Callable[[], None], spread_s: float = 0.0) -> list[RequestRecord]:
    """One worker per client; each sends its next request when its last one ends, the first one after a
    random wait of up to `spread_s`."""
    indices = list(indices)
    pending = iter(indices)  # shared: each worker pulls the next index when it becomes free
    records: list[RequestRecord] = []

    async def worker(client: httpx.AsyncClient, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        for index in pending:
            record = await one_request(client, config, model, index, concurrency, prompt_words, media)
            records.append(record)
            on_done()
            if record.retry_after_s is not None:  # refused: a well-behaved client waits as told
                await asyncio.sleep(record.retry_after_s)

    # seeded by the pool's first index, which differs between client processes
    delays = first_send_delays(f"{config.seed}:{indices[:1]}", len(clients), spread_s)
    await asyncio.gather(*(worker(client, delay) for client, delay in zip(clients, delays, strict=True)))
    return sorted(records, key=lambda r: r.index)


def first_send_delays(seed: str, workers: int, spread_s: float) -> list[float]:
    """Each worker's wait before its first request: uniform in [0, spread_s), the same for the same seed."""
    rng = random.Random(seed)
    return [rng.uniform(0, spread_s) for _ in range(workers)]


def own_client(client: httpx.AsyncClient) -> httpx.AsyncClient:
    """A one-connection client with ``client``'s base URL, timeout and proxy policy.

    Each worker has its own, as each of C users would: one pool of C connections costs O(C) Python
    per request in httpcore (its expiry scan), which at C=64 delayed request starts by up to 0.6 s
    on the client (measured against a canned server). Made before the clock starts: a client's
    construction loads CA certificates (tens of ms)."""
    return httpx.AsyncClient(base_url=client.base_url, timeout=client.timeout, trust_env=client.trust_env,
                             limits=httpx.Limits(max_connections=1))


def requests(config: BenchConfig, concurrency: int) -> int:
    """Recorded requests of a level at `concurrency`."""
    return config.num_requests or max(2 * concurrency, 4)


async def run_level(client: httpx.AsyncClient, config: BenchConfig, model: str, prompt_words: int,
                    concurrency: int, media: RequestMedia, progress: Progress) -> LevelResult:
    n = requests(config, concurrency)
    task = progress.add_task(f"P={prompt_words} C={concurrency}", total=config.warmup + n)
    advance = lambda: progress.advance(task)  # noqa: E731
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(own_client(client)) for _ in range(concurrency)]
        return await _measure_level(client, clients, config, model, prompt_words, concurrency, media, n, advance)


async def _measure_level(client: httpx.AsyncClient, clients: list[httpx.AsyncClient], config: BenchConfig,
                         model: str, prompt_words: int, concurrency: int, media: RequestMedia, n: int,
                         advance: Callable[[], None]) -> LevelResult:
    warm = await _run_pool(clients[:max(min(concurrency, config.warmup), 1)], config, model,
                           range(-config.warmup, 0), concurrency, prompt_words, media, advance)
    if failed := [r.error for r in warm if not r.ok]:
        log.warning("%d warm-up request(s) failed at P=%d C=%d: %s", len(failed), prompt_words, concurrency,
                    failed[0])
    before = await server_latency_sums(client)
    lags: list[float] = []
    watch = asyncio.create_task(watch_loop_lag(lags))
    t0 = time.perf_counter()
    try:
        if config.client_processes > 1:
            job = (config, model, prompt_words, concurrency, media)
            records, wall_s = await asyncio.to_thread(run_in_processes, _pool_work, job, n, concurrency,
                                                      config.client_processes)
            records.sort(key=lambda r: r.index)
            for _ in records:
                advance()
        else:
            records = await _run_pool(clients, config, model, range(n), concurrency, prompt_words, media,
                                      advance, config.spread_s)
            wall_s = time.perf_counter() - t0
    finally:
        watch.cancel()
    level = summarize_level(concurrency, records, wall_s, prompt_words)
    after = await server_latency_sums(client)
    # a labelled series appears with its first sample: one the level began shows its whole sum
    means = {name: (after[name][0] - before.get(name, (0.0, 0.0))[0]) / count
             for name in after if (count := after[name][1] - before.get(name, (0.0, 0.0))[1]) > 0}
    return replace(level, server_ttft_mean_s=means.get("engine_ttft_seconds"),
                   server_ttfp_mean_s=means.get("engine_ttfp_seconds"),
                   server_first_packet_parts_mean_s=first_packet_parts(means),
                   server_http_ttft_mean_s=means.get("gateway_chat_ttft_seconds"),
                   server_http_ttfp_mean_s=means.get("gateway_chat_ttfp_seconds"),
                   server_crossing_mean_s=means.get(CROSSING), server_image_decode_mean_s=means.get(IMAGE_DECODE),
                   server_vision_tower_calls=count_between(before, after, VISION_TOWER),
                   server_vision_tower_mean_s=means.get(VISION_TOWER), client_lag_ms=Stat.of(lags),
                   server_steps=step_shares(before, after, wall_s))


async def _pool_work(job: tuple[BenchConfig, str, int, int, RequestMedia], indices: list[int], workers: int,
                     started: Started) -> list[RequestRecord]:
    """One client process's share of a level (`processes.run_in_processes` runs it)."""
    config, model, prompt_words, concurrency, media = job
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(httpx.AsyncClient(
            base_url=config.url.rstrip("/"), timeout=config.timeout, trust_env=False,
            limits=httpx.Limits(max_connections=1))) for _ in range(workers)]
        await started()
        return await _run_pool(clients, config, model, indices, concurrency, prompt_words, media,
                               lambda: None, config.spread_s)


async def watch_loop_lag(lags: list[float], period_s: float = 0.005) -> None:
    """Appends how late this event loop wakes for a `period_s` timer (ms) until cancelled."""
    while True:
        t = time.perf_counter()
        await asyncio.sleep(period_s)
        lags.append(1000 * (time.perf_counter() - t - period_s))


async def fetch_models(client: httpx.AsyncClient) -> dict[str, Any] | None:
    try:
        resp = await client.get("/v1/models")
        resp.raise_for_status()
        return resp.json()
    except (httpx.HTTPError, ValueError) as exc:
        log.warning("GET /v1/models failed: %s", exc)
        return None


async def target_model(client: httpx.AsyncClient, model: str | None, url: str) -> tuple[str, dict[str, Any] | None]:
    """`model`, or else the first id the server lists; and what GET /v1/models said (None if it failed)."""
    models = await fetch_models(client)
    ids = [m.get("id") for m in (models or {}).get("data") or [] if isinstance(m, dict)]
    chosen = model or next((i for i in ids if i), None)
    if chosen is None:
        raise BenchError(f"no --model given and {url}/v1/models listed none")
    return chosen, models


async def measure(config: BenchConfig, console: Console | None = None) -> BenchResult:
    """Run every level against the server at config.url; writes nothing."""
    # before the server is asked anything: a bad picture or clip ends the run at once
    pictures = sum(config.warmup + requests(config, c) for _, c in config.levels())
    image, video = read_image(config.image, pictures), read_video(config.video)
    # trust_env=False: proxies from the environment would distort latency numbers.
    async with httpx.AsyncClient(base_url=config.url.rstrip("/"), timeout=config.timeout,
                                 limits=httpx.Limits(max_connections=max(config.concurrency)),
                                 trust_env=False) as client:
        model, models = await target_model(client, config.model, config.url)
        # read once, before any clock starts: each request sends one of these as it is
        input_audio = tuple(base64.b64encode(q.wav).decode() for q in load_questions(config.input_audio)) \
            if config.input_audio else ()
        media = RequestMedia(input_audio, image.data_urls if image else (), video_url=video.data_url if video else None)
        levels = []
        with Progress(console=console or Console(stderr=True), disable=not config.show_progress) as progress:
            for prompt_words, concurrency in config.levels():
                levels.append(await run_level(client, config, model, prompt_words, concurrency, media, progress))
                media = replace(media, first_image=media.first_image + config.warmup + requests(config, concurrency))
    cfg = asdict(replace(config, model=model))
    for key in ("argv", "show_progress"):
        cfg.pop(key)
    return BenchResult(label=config.label, created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       command=shlex.join(config.argv), config=cfg, machine=machine_info(),
                       server_models=models, levels=levels, image=image.info if image else None,
                       video=video.info if video else None)


async def run_bench(config: BenchConfig) -> BenchResult:
    result = await measure(config)
    write_outputs(result, Path(config.out_dir))
    return result


def write_outputs(result: BenchResult, out_dir: Path) -> tuple[Path, Path]:
    json_path = write_json(asdict(result), out_dir / f"{result.label}.json", SCHEMA_VERSION)
    png_path = plot_runs([(result.label, [asdict(lv) for lv in result.levels])], out_dir / f"{result.label}.png",
                         title=f"voice-gateway bench: {result.label}")
    log.info("wrote %s and %s", json_path, png_path)
    return json_path, png_path
