"""In-process engine sweep for the GPU machine, which has no web stack: TTFP, RTF and req/s per concurrency.

Times are taken on the engine's own clock (submit -> event), without HTTP; `voice-gateway bench` measures
the same quantities end to end where the server can run. Writes JSON to --out and prints a table.

    PYTHONPATH=. python benchmarks/h200/engine_sweep.py --profile benchmarks/h200/dummy-eager.yaml --out result.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from engine import (
    AudioChunk,
    EngineRequest,
    Failed,
    Finished,
    Message,
    SamplingParams,
    TextDelta,
    TextPart,
    create_engine,
    load_profile,
)

RATE = 24_000


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


async def one(engine, index: int, prompt_words: int) -> dict:
    words = " ".join(f"word{(index * 7 + i) % 97}" for i in range(prompt_words))
    request = EngineRequest(f"r{index}-{time.monotonic_ns()}", (Message("user", (TextPart(f"#{index} {words}"),)),),
                            True, None, SamplingParams(seed=index))
    t0 = time.perf_counter()
    ttft = ttfp = last = None
    samples = 0
    stream = await engine.submit(request)
    async for event in stream:
        now = time.perf_counter() - t0
        if isinstance(event, TextDelta) and ttft is None:
            ttft = now
        elif isinstance(event, AudioChunk):
            ttfp = now if ttfp is None else ttfp
            last, samples = now, samples + event.samples.size
        elif isinstance(event, Failed):
            return {"ok": False, "error": event.reason}
        elif isinstance(event, Finished):
            return {"ok": True, "ttft_s": ttft, "ttfp_s": ttfp, "latency_s": now, "audio_s": samples / RATE,
                    "rtf": (last / (samples / RATE)) if samples else None,
                    "frames": event.timings.codec_frames, "tokens": event.timings.completion_tokens}
    return {"ok": False, "error": "stream ended"}


async def level(engine, concurrency: int, num: int, prompt_words: int) -> dict:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(num):
        queue.put_nowait(i)
    records: list[dict] = []

    async def worker() -> None:
        while not queue.empty():
            records.append(await one(engine, queue.get_nowait(), prompt_words))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    ok = [r for r in records if r["ok"]]
    summary = {"concurrency": concurrency, "requests": num, "failures": len(records) - len(ok), "wall_s": wall,
               "req_per_s": len(ok) / wall}
    for key in ("ttft_s", "ttfp_s", "rtf", "latency_s", "audio_s"):
        vals = [r[key] for r in ok if r.get(key) is not None]
        summary[key] = {"mean": statistics.fmean(vals) if vals else None, "p50": pct(vals, 0.5), "p99": pct(vals, 0.99)}
    summary["records"] = records
    return summary


def stage_steps(engine) -> dict:
    out = {}
    for metric in engine.registry.collect():
        if metric.name not in ("engine_stage_step_seconds", "engine_stage_batch_size"):
            continue
        for s in metric.samples:
            if s.name.endswith(("_sum", "_count")):
                out.setdefault(s.labels["stage"], {})[f"{metric.name}{s.name[len(metric.name):]}"] = s.value
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", type=Path, required=True)
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--requests-per-level", type=int, default=0, help="default: max(2, concurrency)")
    parser.add_argument("--prompt-words", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    profile = load_profile(args.profile, model="dummy")
    t0 = time.perf_counter()
    engine = create_engine(profile.model, profile)
    load_s = time.perf_counter() - t0
    await engine.start()
    print(f"loaded in {load_s:.1f}s; GPU memory {torch.cuda.memory_allocated() / 2**30:.1f} GiB", flush=True)
    await one(engine, -1, args.prompt_words)  # warm-up
    levels = []
    for c in (int(x) for x in args.concurrency.split(",")):
        before = stage_steps(engine)
        result = await level(engine, c, args.requests_per_level or max(2, c), args.prompt_words)
        result["stage_steps"] = {"before": before, "after": stage_steps(engine)}
        levels.append(result)
        print(f"c={c:3d} req/s={result['req_per_s']:.2f} ttfp mean={result['ttfp_s']['mean']} "
              f"rtf mean={result['rtf']['mean']} fail={result['failures']}", flush=True)
        args.out.write_text(json.dumps(_report(args, profile, load_s, levels), indent=1, default=str))
    await engine.stop()


def _report(args, profile, load_s: float, levels: list[dict]) -> dict:
    import transformers

    return {
        "command": " ".join(sys.argv), "profile": str(profile), "load_s": load_s,
        "machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "transformers": transformers.__version__, "python": platform.python_version()},
        "levels": levels,
    }


if __name__ == "__main__":
    asyncio.run(main())
