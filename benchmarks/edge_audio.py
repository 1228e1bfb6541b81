"""The realtime edge's own cost of reply audio, without an engine: per step and per output format, and a
simulated event loop carrying many sessions' replies.

The audio is synthetic (a voiced-speech-like tone with noise), fed in the GPU profile's chunk schedule
(4, 8, 16, then 25 codec frames of 80 ms). Two measurements:

* `steps`: each step of a format's path, timed alone over a 10 s reply: the edge's cost per 20 ms of audio.
* `loop`: N sessions on one event loop with the real sinks, outboxes and a writer per session that takes each
  message as a WebSocket writer would; a synthetic engine hands out every session's next chunk on an 80 ms
  step clock (Code2Wav batches all requests, so chunks land together) at a real-time factor. It reports
  the loop's longest stall and the turns with a message more than 20 ms behind real-time playback.

    PYTHONPATH=. python benchmarks/edge_audio.py steps
    PYTHONPATH=. python benchmarks/edge_audio.py send
    PYTHONPATH=. python benchmarks/edge_audio.py loop --sessions 16 --format opus

It lives here, not in `bench/`, because it drives the edge's own objects in process, which `bench/` never imports.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engine import SAMPLE_RATE_HZ
from voice_gateway.audio.g711 import ulaw_encode
from voice_gateway.audio.opus import FRAME_SAMPLES, OpusStream
from voice_gateway.audio.wav import float_to_pcm16
from voice_gateway.openai.sse import ChunkWriter
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.audio_sinks import event_sink
from voice_gateway.realtime.outbox import Outbox
from voice_gateway.realtime.sender import EventSender

FRAME_SAMPLES_24K = 1920  # one codec frame: 80 ms at 24 kHz
SCHEDULE_FRAMES = (4, 8, 16, 25, 25, 25, 22)  # the GPU profile's chunks of a 125-frame (10 s) reply
PIECE_S = 0.020
LATE_S = 0.020
CODE2WAV_STEP_S = 0.080  # the step clock every session's chunks come out on
FORMATS = ("opus", "pcm16", "g711_ulaw")


def synthetic_reply(seconds: float, seed: int = 0) -> np.ndarray:
    """A 150 Hz voiced tone with harmonics, a syllable-rate envelope and a little noise, float32 24 kHz."""
    t = np.arange(int(seconds * SAMPLE_RATE_HZ)) / SAMPLE_RATE_HZ
    voiced = sum(np.sin(2 * np.pi * 150 * k * t) / k for k in range(1, 12))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t)
    noise = np.random.default_rng(seed).normal(0, 0.02, t.size)
    return (0.1 * voiced * envelope + noise).astype(np.float32)


def chunks(reply: np.ndarray) -> list[np.ndarray]:
    out, start = [], 0
    for frames in SCHEDULE_FRAMES:
        out.append(reply[start : start + frames * FRAME_SAMPLES_24K])
        start += frames * FRAME_SAMPLES_24K
    return out


# --- steps ---------------------------------------------------------------------------------------------------


def _timed(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of one call of `fn` over `repeat` calls."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def step_costs(repeat: int = 15) -> list[tuple[str, str, float]]:
    """(format, step, microseconds per 20 ms of reply audio) for each step, over one 10 s reply."""
    reply = synthetic_reply(10.0)
    parts = chunks(reply)
    pieces = reply.size / (PIECE_S * SAMPLE_RATE_HZ)
    rows: list[tuple[str, str, float]] = []

    def row(fmt: str, step: str, fn: Callable[[], object]) -> None:
        rows.append((fmt, step, _timed(fn, repeat) / pieces * 1e6))

    stream = OpusStream(bitrate_bps=96_000)
    resampler = stream._resampler

    def resample() -> None:
        resampler.reset()
        for p in parts:
            resampler.process(p)

    def encode_all() -> None:
        stream.start_response()
        for p in parts:
            stream.encode(p)
        stream.flush()

    packets = [p for c in parts for p in stream.encode(c)] + stream.flush()
    row("opus", "resample 24->48 kHz (soxr)", resample)
    row("opus", "resample + encode + header (OpusStream)", encode_all)
    row("opus", "header pack", lambda: [p.pack() for p in packets])
    outbox = Outbox(4096)
    wire = [p.pack() for p in packets]

    def through_outbox() -> None:
        for w in wire:
            outbox.put(w, "resp")
        while outbox.get_nowait() is not None:
            pass

    row("opus", "outbox put + get", through_outbox)

    delta_sender = EventSender(Outbox(4096), ev.Dialect.GA)

    def pcm16_events() -> None:
        for p in parts:
            ev.serialize(ev.OutputAudioDelta(response_id="resp", item_id="item", delta=float_to_pcm16(p)),
                         delta_sender.dialect)

    row("pcm16", "float -> PCM16", lambda: [float_to_pcm16(p) for p in parts])
    row("pcm16", "float -> PCM16 + event (base64, JSON)", pcm16_events)
    g711 = event_sink(ev.AudioFormat.G711_ULAW, delta_sender, 0)

    def g711_chunks() -> None:
        g711.begin("resp", "item")
        for p in parts:
            g711.write(p)
        while delta_sender.outbox.get_nowait() is not None:
            pass

    row("g711_ulaw", "resample 24->8 kHz + mu-law + event (G711Sink)", g711_chunks)
    row("g711_ulaw", "mu-law alone", lambda: [ulaw_encode(p[::3]) for p in parts])
    writer = ChunkWriter("chatcmpl-1", "model", 0)
    row("chat SSE", "float -> PCM16 + SSE chunk (ChunkWriter)", lambda: [writer.audio(float_to_pcm16(p), 0)
                                                                          for p in parts])
    return rows


async def send_costs(messages: int = 5000) -> list[tuple[str, float]]:
    """Microseconds of the server's loop per message sent over loopback WebSocket (the `websockets` library, the
    implementation uvicorn serves with), for an Opus packet and for a 2 s PCM16 delta event."""
    import websockets

    opus = bytes(252)  # 12-byte header + a 96 kbps 20 ms packet
    pcm_event = json.dumps({"type": "response.output_audio.delta", "delta": base64.b64encode(bytes(96_000)).decode()})
    results: list[tuple[str, float]] = []
    done = asyncio.Event()

    async def handler(ws: websockets.ServerConnection) -> None:
        for name, payload, count in (("opus packet", opus, messages), ("PCM16 delta (2 s)", pcm_event, 200)):
            t = time.process_time()
            for _ in range(count):
                await ws.send(payload)
            results.append((name, (time.process_time() - t) / count * 1e6))
        done.set()

    async with websockets.serve(handler, "127.0.0.1", 0, max_size=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        client = await asyncio.create_subprocess_exec(
            "python", "-c", "import sys, websockets.sync.client as c\n"
            f"ws = c.connect('ws://127.0.0.1:{port}', max_size=None)\n"
            "try:\n    while True: ws.recv()\nexcept Exception: pass\n")
        await done.wait()
        client.terminate()
        await client.wait()
    return results


# --- loop -----------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Turn:
    pieces: list[tuple[float, float]]  # (time the writer took it, where it starts in the reply s)
    next_pcm_s: float = 0.0


def late_pieces(pieces: list[tuple[float, float]]) -> tuple[int, float]:
    """(pieces more than LATE_S behind a player that starts at the first piece, worst lateness s)."""
    t0 = pieces[0][0] - pieces[0][1]
    lateness = [t - (t0 + start) for t, start in pieces]
    return sum(1 for late in lateness if late > LATE_S), max(lateness)


async def run_loop(fmt: str, sessions: int, turns: int, rtf: float, seed: int = 0) -> dict[str, float]:
    """`sessions` concurrent conversations of `turns` 10 s replies each on this event loop."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    reply_parts = chunks(synthetic_reply(10.0, seed))
    stalls: list[float] = []
    records: list[Turn] = []
    busy = 0.0

    async def probe(stop: asyncio.Event) -> None:
        while not stop.is_set():
            t = loop.time()
            await asyncio.sleep(0.005)
            stalls.append(loop.time() - t - 0.005)

    async def writer(outbox: Outbox, current: list[Turn]) -> None:
        while (payload := await outbox.get()) is not None:
            turn, now = current[0], time.perf_counter()
            if isinstance(payload, bytes):
                offset = int.from_bytes(payload[8:12], "big")
                turn.pieces.append((now, offset / SAMPLE_RATE_HZ))
            elif '"response.output_audio.delta"' in payload[:80]:
                seconds = len(base64.b64decode(json.loads(payload)["delta"])) / (
                    2 * SAMPLE_RATE_HZ if fmt == "pcm16" else 8_000)
                turn.pieces.append((now, turn.next_pcm_s))
                turn.next_pcm_s += seconds

    async def session(index: int) -> None:
        nonlocal busy
        outbox = Outbox(4096)
        sender = EventSender(outbox, ev.Dialect.GA)
        sink = event_sink(ev.AudioFormat(fmt), sender, 96_000)
        current = [Turn([])]
        task = asyncio.create_task(writer(outbox, current))
        await asyncio.sleep(rng.uniform(0, 2.0))  # conversations start at different times
        for turn_index in range(turns):
            current[0] = Turn([])
            response_id = f"resp_{index}_{turn_index}"
            sink.begin(response_id, "item")
            await asyncio.sleep(0.3)  # time to first packet
            for part in reply_parts:
                t = time.perf_counter()
                sink.write(part)
                busy += time.perf_counter() - t
                # the next chunk is made at this RTF, and comes out on the engine's step clock with every other's
                ready = loop.time() + rtf * len(part) / SAMPLE_RATE_HZ
                await asyncio.sleep(-ready % CODE2WAV_STEP_S + ready - loop.time())
            sink.finish()
            sender.event(ev.ResponseDone(response=ev.RealtimeResponse(id=response_id)))
            await asyncio.sleep(10.0 + rng.uniform(0.5, 1.5))  # the reply plays out; the user answers
            records.append(current[0])
        outbox.close()
        await task

    stop = asyncio.Event()
    probe_task = asyncio.create_task(probe(stop))
    t_start = time.perf_counter()
    await asyncio.gather(*(session(i) for i in range(sessions)))
    wall = time.perf_counter() - t_start
    stop.set()
    await probe_task
    late = [late_pieces(r.pieces) for r in records if r.pieces]
    return {"turns": len(records), "late_turns": sum(1 for n, _ in late if n), "worst_late_ms": 1e3 * max(
        w for _, w in late), "loop_stall_max_ms": 1e3 * max(stalls), "loop_stall_p99_ms": 1e3 * float(
        np.percentile(stalls, 99)), "write_ms_per_audio_s": 1e3 * busy / (len(records) * 10.0), "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("steps", "send", "loop"))
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--rtf", type=float, default=0.25, help="the engine's real-time factor")
    parser.add_argument("--format", choices=FORMATS, default="opus")
    args = parser.parse_args()
    if args.what == "steps":
        print(f"{'format':<10} {'step':<48} {'us / 20 ms':>10} {'ms / s':>8}")
        for fmt, step, us in step_costs():
            print(f"{fmt:<10} {step:<48} {us:>10.1f} {us / 20:>8.2f}")
        print(f"(Opus frame: {FRAME_SAMPLES} samples at 48 kHz, 96 kbps)")
    elif args.what == "send":
        for name, us in asyncio.run(send_costs()):
            print(f"send {name}: {us:.1f} us of the server's CPU per message")
    else:
        result = asyncio.run(run_loop(args.format, args.sessions, args.turns, args.rtf))
        print(json.dumps({"format": args.format, "sessions": args.sessions, "rtf": args.rtf, **result}))


if __name__ == "__main__":
    main()
