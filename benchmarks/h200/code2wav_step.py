"""One Code2Wav chunk step at full size: windowed (left context re-decoded) against stateful streaming.

    PYTHONPATH=. python3 benchmarks/h200/code2wav_step.py --out code2wav-step.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from engine.models.code2wav_stream import StreamBatch, StreamingCode2Wav
from engine.models.full_size import build_dummy_stage


def timed(fn, iters: int = 10) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    model, _ = build_dummy_stage("code2wav", device="cuda", dtype="bfloat16")
    stream = StreamingCode2Wav(model, num_slots=128)
    rows = []
    for batch, chunk, context in ((1, 4, 0), (1, 25, 25), (16, 25, 25), (64, 25, 25), (64, 4, 0)):
        codes = torch.randint(0, 2048, (batch, 16, chunk + context), device="cuda")
        with torch.inference_mode():
            windowed = timed(lambda: model(codes))
            step = StreamBatch(codes[..., context:], torch.arange(batch), torch.full((batch,), chunk),
                               torch.full((batch,), 50))
            streaming = timed(lambda: stream.decode(step))
        rows.append({"batch": batch, "chunk_frames": chunk, "left_context_frames": context,
                     "windowed_ms": windowed, "streaming_ms": streaming})
        print(rows[-1], flush=True)
    args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                                   indent=1))


if __name__ == "__main__":
    main()
