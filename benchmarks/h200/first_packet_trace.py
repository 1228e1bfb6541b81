"""A timeline of one reply: every stage step from submit to the first audio packet.

Starts the engine in-process for a profile, runs two warm-up replies, then one traced reply and
prints each stage step (start, duration, batch) in milliseconds since submit, and each stage's
step count and summed time in that window. With --background N, N other replies run in a
closed loop while the traced one is made (what a reply meets at concurrency N + 1). Also times Code2Wav
on chunk shapes it has not seen yet (new batch sizes), to show what a first-seen shape costs.

    PYTHONPATH=. python3 benchmarks/h200/first_packet_trace.py --profile benchmarks/h200/dummy-stage-streams.yaml --out trace.json

With --closed-loop C, runs a bench level in-process instead: C workers start at once, each sending
its next reply when the last ends; prints TTFT/TTFP of the first wave (a burst) and of the later
replies, and keeps the first wave's stage timeline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import torch

from engine import (
    AudioChunk,
    EngineRequest,
    Message,
    SamplingParams,
    TextDelta,
    TextPart,
    create_engine,
    load_profile,
)
from engine.models.code2wav_stream import StreamBatch

EVENTS: list[tuple[float, str, float, int, bool]] = []  # (start s, stage, duration ms, batch, has the traced reply)
TRACED = "t9"


def traced(stage) -> None:
    step = stage.step

    def wrapper():
        t0 = time.perf_counter()
        ids = step()  # host time: a step's own host syncs are inside it
        EVENTS.append((t0, stage.name, 1000 * (time.perf_counter() - t0), len(ids), TRACED in ids))
        return ids

    stage.step = wrapper


async def one(engine, i: int) -> dict:
    words = " ".join(["please tell me about the weather"] * 6)
    request = EngineRequest(f"t{i}", (Message("user", (TextPart(words),)),), True, "ethan", SamplingParams(max_tokens=40))
    t0 = time.perf_counter()
    marks = {"submit": t0}
    stream = await engine.submit(request)
    async for event in stream:
        if isinstance(event, TextDelta) and "first_text" not in marks:
            marks["first_text"] = time.perf_counter()
        if isinstance(event, AudioChunk) and "first_audio" not in marks:
            marks["first_audio"] = time.perf_counter()
    marks["done"] = time.perf_counter()
    return marks


async def loop_replies(engine, i: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await one(engine, 1000 + i)


def summary_ms(marks: list[dict], key: str) -> dict:
    values = sorted(1000 * (m[key] - m["submit"]) for m in marks)
    return {"mean": round(sum(values) / len(values), 1), "p50": round(values[len(values) // 2], 1),
            "max": round(values[-1], 1)}


async def closed_loop(engine, concurrency: int, requests: int) -> dict:
    """What `voice-gateway bench` does at one level, in-process: `concurrency` workers start together
    (a burst) and each sends its next reply when the last one ends. Keeps the first wave's timeline."""
    for stage in engine.stages.values():
        traced(stage)
    EVENTS.clear()
    pending = iter(range(requests))
    marks: list[dict] = []

    async def worker() -> None:
        for i in pending:
            marks.append({"index": i, **await one(engine, 2000 + i)})

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    first_wave = [m for m in marks if m["index"] < concurrency]
    second_wave = [m for m in marks if concurrency <= m["index"] < 2 * concurrency]
    result = {"concurrency": concurrency, "requests": requests, "req_per_s": round(requests / wall, 2)}
    for name, group in (("all", marks), ("first_wave", first_wave), ("later", [m for m in marks if m not in first_wave])):
        if group:
            result[name] = {k: summary_ms(group, k) for k in ("first_text", "first_audio")}
    for name, wave in (("first_wave", first_wave), ("second_wave", second_wave)):
        if wave:  # from the wave's first submit to its last first packet
            start, end = min(m["submit"] for m in wave), max(m["first_audio"] for m in wave)
            steps = [(t, s, d, b) for t, s, d, b, _ in sorted(EVENTS) if start <= t < end]
            result[f"{name}_window_ms"] = round(1000 * (end - start), 1)
            result[f"{name}_stages"] = {
                stage: {"steps": len(mine), "ms": round(sum(d for _, _, d, _ in mine), 1),
                        "mean_batch": round(sum(b for *_, b in mine) / len(mine), 1)}
                for stage in sorted({s for _, s, _, _ in steps})
                if (mine := [e for e in steps if e[1] == stage])}
            result[f"{name}_timeline"] = [{"t_ms": round(1000 * (t - start), 1), "stage": s, "ms": round(d, 1),
                                           "batch": b} for t, s, d, b in steps]
            # Each reply's submit and first packet on the wave's clock: do early arrivals wait for late ones?
            result[f"{name}_replies"] = sorted(
                (round(1000 * (m["submit"] - start), 1), round(1000 * (m["first_audio"] - start), 1)) for m in wave)
    return result


async def run(profile_path: Path, model: str, background: int, replies: int, loop: tuple[int, int] | None) -> dict:
    engine = create_engine(model, load_profile(profile_path, model=model), None)
    await engine.start()
    stages = engine.stages
    device = stages["code2wav"].runner.device
    try:
        for i in range(2):
            await one(engine, i)
        if loop is not None:
            return await closed_loop(engine, *loop)
        stop = asyncio.Event()
        others = []
        for i in range(background):  # staggered, as a closed loop's arrivals are once it runs
            others.append(asyncio.create_task(loop_replies(engine, i, stop)))
            await asyncio.sleep(0.05)
        if background:
            await asyncio.sleep(6.0)
        for stage in stages.values():
            traced(stage)
        earlier = []  # more traced replies before the one whose timeline is kept: one reply is noisy
        for i in range(replies - 1):
            m = await one(engine, 100 + i)
            earlier.append({k: round(1000 * (v - m["submit"]), 1) for k, v in m.items()})
        EVENTS.clear()
        marks = await one(engine, int(TRACED[1:]))
        stop.set()
        await asyncio.gather(*others)
        t0 = marks["submit"]
        window = [e for e in sorted(EVENTS) if t0 <= e[0] < marks["first_audio"] + 0.05]
        timeline = [{"t_ms": round(1000 * (t - t0), 1), "stage": s, "ms": round(d, 1), "batch": b, "traced": mine}
                    for t, s, d, b, mine in window]
        per_stage = {}
        for _, s, d, _, _ in window:
            entry = per_stage.setdefault(s, {"steps": 0, "ms": 0.0})
            entry["steps"] += 1
            entry["ms"] = round(entry["ms"] + d, 1)
        result = {"background": background, "marks_ms": {k: round(1000 * (v - t0), 1) for k, v in marks.items()},
                  "earlier_replies_marks_ms": earlier,
                  "per_stage": per_stage, "timeline": timeline}
        code2wav = stages["code2wav"]
        cold = []
        with torch.inference_mode():
            for batch, frames in ((3, 25), (5, 25), (7, 21), (3, 25)):
                codes = torch.randint(0, 2048, (batch, 16, frames), device=device)
                step = StreamBatch(codes, torch.arange(batch), torch.full((batch,), frames),
                                   torch.full((batch,), 29))
                t = time.perf_counter()
                code2wav.stream.decode(step)[0].cpu()
                cold.append({"batch": batch, "frames": frames, "ms": round(1000 * (time.perf_counter() - t), 1)})
        result["code2wav_first_seen_shapes"] = cold
        return result
    finally:
        await engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="dummy")
    parser.add_argument("--background", type=int, default=0, help="other replies in a closed loop meanwhile")
    parser.add_argument("--replies", type=int, default=1, help="traced replies in turn; the last one's timeline is kept")
    parser.add_argument("--closed-loop", type=int, default=0, metavar="C",
                        help="instead: C workers in a closed loop, as the bench runs a level (a burst first)")
    parser.add_argument("--requests", type=int, default=0, help="replies in the closed loop (default 2 x C)")
    args = parser.parse_args()
    loop = (args.closed_loop, args.requests or 2 * args.closed_loop) if args.closed_loop else None
    result = asyncio.run(run(args.profile, args.model, args.background, args.replies, loop))
    print(json.dumps({k: v for k, v in result.items() if "timeline" not in k}, indent=1))
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
