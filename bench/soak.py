"""`voice-gateway bench soak`: a long run of mixed traffic against one server while its memory and open files
are sampled, to show whether anything grows with the number of requests served.

The mix: non-streamed text chats, chats with audio in, streamed text+audio chats read to the end, streamed
chats abandoned at their first audio, realtime sessions that take one spoken-reply turn, and realtime sessions
closed while their reply plays. Requests are drawn from a seeded sequence, so every run sends the same mix in
the same order. The server is started here (`ServerProcess`) or already running (`--url` and `--pid`); every
`sample_every_s` the RSS and fd count of its process and all its descendants are read from /proc, and once the
traffic ends and `settle_s` has passed, once more. Writes `{label}.json` and `{label}.png`.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import random
import shlex
import time
import wave
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import websockets

from bench.config import BenchError
from bench.machine import git_commit, machine_info
from bench.plots import plot_soak
from bench.procstat import sample_tree
from bench.server import ServerProcess, ServerStartError
from bench.stats import Stat

SCHEMA_VERSION = 1
# kind -> share of the requests
DEFAULT_MIX = {"chat_text": 35, "chat_audio_in": 15, "chat_stream_audio": 15, "chat_abandoned": 15,
               "realtime_turn": 12, "realtime_abandoned": 8}


@dataclass
class SoakConfig:
    url: str = "http://127.0.0.1:8000"  # with `pid`: the running server to soak
    pid: int | None = None  # the running server's process; None: start one with `serve_args`
    serve_args: list[str] = field(default_factory=lambda: ["tiny"])
    requests: int = 1200
    concurrency: int = 4
    max_tokens: int = 4  # text tokens per reply: the soak counts requests, not their length
    timeout_s: float = 120.0
    sample_every_s: float = 1.0
    settle_s: float = 5.0  # after the last request, before the final sample
    seed: int = 0
    mix: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_MIX))
    label: str = "soak"
    out_dir: Path = Path("benchmarks/local")
    argv: list[str] = field(default_factory=list)


@dataclass
class Outcome:
    kind: str
    ok: bool
    latency_s: float
    error: str | None = None


def _wav_tone(seconds: float = 0.5, rate_hz: int = 16_000) -> bytes:
    t = np.arange(int(seconds * rate_hz)) / rate_hz
    pcm = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate_hz)
        f.writeframes(pcm.tobytes())
    return buf.getvalue()


_TONE_B64 = base64.b64encode(_wav_tone()).decode()


class Traffic:
    """The soak's requests, one coroutine per kind; each says whether the server answered as it should."""

    def __init__(self, config: SoakConfig, url: str, model: str) -> None:
        self.config = config
        self.model = model
        self.ws_url = url.replace("http://", "ws://", 1).rstrip("/") + f"/v1/realtime?model={model}"

    def by_kind(self) -> dict[str, Callable[[httpx.AsyncClient, int], Awaitable[None]]]:
        return {"chat_text": self.chat_text, "chat_audio_in": self.chat_audio_in,
                "chat_stream_audio": self.chat_stream_audio, "chat_abandoned": self.chat_abandoned,
                "realtime_turn": self.realtime_turn, "realtime_abandoned": self.realtime_abandoned}

    def _body(self, index: int, **fields: Any) -> dict[str, Any]:
        return {"model": self.model, "max_tokens": self.config.max_tokens, "seed": index,
                "messages": [{"role": "user", "content": f"#{index} tell me about the sea"}], **fields}

    async def _chat(self, client: httpx.AsyncClient, body: dict[str, Any]) -> None:
        reply = await client.post("/v1/chat/completions", json=body)
        if reply.status_code != 200 or reply.json().get("object") != "chat.completion":
            raise RuntimeError(f"HTTP {reply.status_code}: {reply.text[:200]}")

    async def chat_text(self, client: httpx.AsyncClient, index: int) -> None:
        await self._chat(client, self._body(index))

    async def chat_audio_in(self, client: httpx.AsyncClient, index: int) -> None:
        content = [{"type": "text", "text": f"#{index} what is this?"},
                   {"type": "input_audio", "input_audio": {"data": _TONE_B64, "format": "wav"}}]
        await self._chat(client, self._body(index, messages=[{"role": "user", "content": content}]))

    async def _stream(self, client: httpx.AsyncClient, index: int, abandon: bool) -> None:
        body = self._body(index, stream=True, modalities=["text", "audio"], audio={"voice": "ethan", "format": "pcm16"})
        async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
            if reply.status_code != 200:
                raise RuntimeError(f"HTTP {reply.status_code}: {(await reply.aread())[:200]!r}")
            async for line in reply.aiter_lines():
                if line == "data: [DONE]":
                    return
                if line.startswith("data: ") and "error" in (chunk := json.loads(line[6:])):
                    raise RuntimeError(f"error in the stream: {chunk['error']}")
                if abandon and line.startswith("data: ") and '"data"' in line:
                    return  # the first audio: hang up, the server must free the request
        if not abandon:
            raise RuntimeError("the stream ended without data: [DONE]")

    async def chat_stream_audio(self, client: httpx.AsyncClient, index: int) -> None:
        await self._stream(client, index, abandon=False)

    async def chat_abandoned(self, client: httpx.AsyncClient, index: int) -> None:
        await self._stream(client, index, abandon=True)

    async def _realtime(self, index: int, abandon: bool) -> None:
        async with websockets.connect(self.ws_url, open_timeout=self.config.timeout_s, max_size=None) as ws:
            await self._until(ws, "session.created")
            await ws.send(json.dumps({"type": "session.update", "session": {
                "max_output_tokens": self.config.max_tokens, "audio": {"input": {"turn_detection": None}}}}))
            await self._until(ws, "session.updated")
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": f"#{index} hello"}]}}))
            await ws.send(json.dumps({"type": "response.create"}))
            if abandon:
                await self._until(ws, "response.output_audio.delta")
                return  # closing the socket mid-reply: the session must cancel it
            done = await self._until(ws, "response.done")
            if (status := done["response"]["status"]) != "completed":
                raise RuntimeError(f"response.done with status {status}: {done['response'].get('status_details')}")

    async def _until(self, ws: Any, event_type: str) -> dict[str, Any]:
        while True:
            message = await ws.recv()
            if isinstance(message, bytes):
                continue
            event = json.loads(message)
            if event["type"] == "error":
                raise RuntimeError(f"error event: {event['error']}")
            if event["type"] == event_type:
                return event

    async def realtime_turn(self, client: httpx.AsyncClient, index: int) -> None:
        await self._realtime(index, abandon=False)

    async def realtime_abandoned(self, client: httpx.AsyncClient, index: int) -> None:
        await self._realtime(index, abandon=True)


def request_plan(config: SoakConfig) -> list[str]:
    """The kind of each request, in order: the mix's shares drawn with the seed."""
    if unknown := set(config.mix) - set(DEFAULT_MIX):
        raise BenchError(f"unknown request kinds {sorted(unknown)}; known: {', '.join(DEFAULT_MIX)}")
    kinds = [k for k in config.mix if config.mix[k] > 0]
    return random.Random(config.seed).choices(kinds, weights=[config.mix[k] for k in kinds], k=config.requests)


class Sampler:
    """Owns the samples: the server's processes' memory and open files, with the requests finished so far."""

    def __init__(self, pid: int, t0: float) -> None:
        self.pid, self.t0 = pid, t0
        self.samples: list[dict[str, Any]] = []

    def take(self, requests_done: int, phase: str) -> None:
        processes = sample_tree(self.pid)
        if not processes:
            raise BenchError(f"the server (pid {self.pid}) has gone")
        self.samples.append({
            "t_s": round(time.perf_counter() - self.t0, 3), "phase": phase, "requests_done": requests_done,
            "rss_mib": round(sum(p.rss_kib for p in processes) / 1024, 1), "fds": sum(p.fds for p in processes),
            "processes": [asdict(p) for p in processes]})


async def _run_traffic(config: SoakConfig, url: str, model: str, sampler: Sampler) -> list[Outcome]:
    traffic = Traffic(config, url, model).by_kind()
    plan = iter(enumerate(request_plan(config)))
    outcomes: list[Outcome] = []

    async def worker(client: httpx.AsyncClient) -> None:
        for index, kind in plan:
            t = time.perf_counter()
            try:
                await asyncio.wait_for(traffic[kind](client, index), config.timeout_s)
                outcomes.append(Outcome(kind, True, time.perf_counter() - t))
            except (httpx.HTTPError, websockets.WebSocketException, OSError, RuntimeError, ValueError, KeyError,
                    TimeoutError) as exc:
                outcomes.append(Outcome(kind, False, time.perf_counter() - t, f"{type(exc).__name__}: {exc}"[:300]))

    async def watch() -> None:
        while True:
            await asyncio.sleep(config.sample_every_s)
            sampler.take(len(outcomes), "traffic")

    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(httpx.AsyncClient(
            base_url=url.rstrip("/"), timeout=config.timeout_s, trust_env=False,
            limits=httpx.Limits(max_connections=1))) for _ in range(config.concurrency)]
        watcher = asyncio.create_task(watch())
        try:
            await asyncio.gather(*(worker(client) for client in clients))
        finally:
            watcher.cancel()
    return outcomes


async def _model_and_health(url: str) -> tuple[str, dict[str, Any]]:
    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=30, trust_env=False) as client:
        models = (await client.get("/v1/models")).json()
        health = (await client.get("/health")).json()
    return models["data"][0]["id"], health


def _rss_slope_mib_per_1k(samples: list[dict[str, Any]], requests: int) -> float | None:
    """Least-squares growth of RSS against requests served, over the traffic's last 80 % (caches fill first)."""
    late = [s for s in samples if s["phase"] == "traffic" and s["requests_done"] >= 0.2 * requests]
    if len({s["requests_done"] for s in late}) < 3:
        return None
    slope = np.polyfit([s["requests_done"] for s in late], [s["rss_mib"] for s in late], 1)[0]
    return round(float(slope) * 1000, 2)


def summarize(config: SoakConfig, outcomes: list[Outcome], samples: list[dict[str, Any]],
              traffic_s: float) -> dict[str, Any]:
    by_kind = {}
    for kind in sorted({o.kind for o in outcomes}):
        mine = [o for o in outcomes if o.kind == kind]
        by_kind[kind] = {"requests": len(mine), "failed": sum(not o.ok for o in mine),
                         "latency_s": asdict(Stat.of(o.latency_s for o in mine if o.ok))}
    errors = Counter(o.error[:120] for o in outcomes if o.error)
    first, last = samples[0], samples[-1]
    return {
        "requests": len(outcomes), "failed": sum(not o.ok for o in outcomes), "traffic_s": round(traffic_s, 1),
        "req_per_s": round(len(outcomes) / traffic_s, 2), "by_kind": by_kind, "errors": dict(errors.most_common(10)),
        "rss_mib": {"start": first["rss_mib"], "end": last["rss_mib"], "peak": max(s["rss_mib"] for s in samples),
                    "slope_per_1k_requests": _rss_slope_mib_per_1k(samples, len(outcomes))},
        "fds": {"start": first["fds"], "end": last["fds"], "peak": max(s["fds"] for s in samples)},
    }


async def _soak(config: SoakConfig, url: str, pid: int, server_command: str | None) -> dict[str, Any]:
    model, health_before = await _model_and_health(url)
    t0 = time.perf_counter()
    sampler = Sampler(pid, t0)
    sampler.take(0, "before")
    outcomes = await _run_traffic(config, url, model, sampler)
    traffic_s = time.perf_counter() - t0
    sampler.take(len(outcomes), "traffic")
    await asyncio.sleep(config.settle_s)
    sampler.take(len(outcomes), "settled")
    _, health_after = await _model_and_health(url)
    return {
        "schema_version": SCHEMA_VERSION, "label": config.label,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": shlex.join(config.argv),
        "git_commit": git_commit(), "machine": machine_info(), "server": {"url": url, "command": server_command, "pid": pid},
        "config": {k: v for k, v in asdict(config).items() if k not in ("argv", "out_dir")},
        "summary": summarize(config, outcomes, sampler.samples, traffic_s),
        "health": {"before": health_before, "after": health_after}, "samples": sampler.samples,
    }


def run_soak(config: SoakConfig) -> dict[str, Any]:
    """The soak against `config.pid`'s server, or against one started here; writes the JSON and the figure."""
    out_dir = Path(config.out_dir)
    server = None
    if config.pid is None:
        server = ServerProcess(config.serve_args, out_dir / "logs" / f"{config.label}.log")
        try:
            server.start(timeout_s=900)
        except ServerStartError as exc:
            raise BenchError(str(exc)) from exc
        assert server.proc is not None
        url, pid, command = server.url, server.proc.pid, server.command
    else:
        url, pid, command = config.url, config.pid, None
    try:
        result = asyncio.run(_soak(config, url, pid, command))
    finally:
        if server is not None:
            server.stop()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{config.label}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot_soak(result, out_dir / f"{config.label}.png")
    return result
