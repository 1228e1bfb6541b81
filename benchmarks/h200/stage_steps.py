"""Each stage's step in isolation on the GPU (no other stage running): where a step's time goes.

Builds the engine's parts for a profile without starting the stage threads, then times one
Thinker decode step, the Talker's code predictor, its decode step and its sampling tail, and one
Code2Wav chunk, at several batch sizes. Wall = host time of the call including a sync. With
--kernels, each step's kernels at batch 64 too (count, GPU time, the twelve costliest).

    PYTHONPATH=. python3 benchmarks/h200/stage_steps.py --profile benchmarks/h200/dummy-stage-streams.yaml --out steps.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks.h200.timing import kernels, median_wall_ms
from engine import load_profile
from engine.models.build import build_engine_parts
from engine.models.code2wav_stream import StreamBatch
from engine.models.sampler import RowSampling, sample

KERNELS_AT = 64  # with --kernels, the batch whose steps are profiled kernel by kernel


def timed(fn, iters: int = 10, profiled: bool = False) -> dict:
    return {"wall_ms": median_wall_ms(fn, iters), **(kernels(fn) if profiled else {})}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--kernels", action="store_true", help=f"also each step's kernels at batch {KERNELS_AT}")
    args = parser.parse_args()
    parts = build_engine_parts("dummy", load_profile(args.profile, model="dummy"), None)
    stages = parts["stages"]  # with replicas, the first of each
    thinker, talker, code2wav = (stages.get(n) or stages[f"{n}.0"] for n in ("thinker", "talker", "code2wav"))
    results = []
    with torch.inference_mode():
        for batch in (1, 16, 64):
            slots, positions = list(range(batch)), [100] * batch
            ids = [1000 + i for i in range(batch)]
            row = {"batch": batch}
            profiled = args.kernels and batch == KERNELS_AT
            row["thinker_decode"] = timed(lambda: thinker.runner.decode(slots, positions, ids), profiled=profiled)
            tr = talker.runner
            hidden = torch.randn(batch, tr.codec_embedding.embedding_dim, device="cuda", dtype=tr.dtype)
            code0 = torch.randint(0, 2000, (batch,), device="cuda")
            rows = [RowSampling(0.9, 0.8, 50, i) for i in range(batch)]
            row["talker_predictor"] = timed(lambda: tr.residual_codes(hidden, code0, rows), profiled=profiled)
            row["talker_decode"] = timed(lambda: tr.decode(slots, positions, hidden), profiled=profiled)
            logits, _ = tr.decode(slots, positions, hidden)
            on_device = torch.tensor(slots, device="cuda")

            def tail() -> list[int]:  # what TalkerStage._take_code0 does on the device
                masked = tr.penalise_repeats(tr.mask_logits(logits, allow_eos=False), on_device, 1.05)
                tokens = sample(masked, rows)
                tr.remember_codes(on_device, tokens)
                return tokens.tolist()

            row["talker_sampling_tail"] = timed(tail, profiled=profiled)
            codes = torch.randint(0, 2048, (batch, 16, 25), device="cuda")
            step = StreamBatch(codes, torch.arange(batch), torch.full((batch,), 25), torch.full((batch,), 50))
            row["code2wav_chunk25"] = timed(lambda: code2wav.stream.decode(step), iters=5, profiled=profiled)
            results.append(row)
            print(row, flush=True)
    args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "profile": str(args.profile),
                                   "rows": results}, indent=1))


if __name__ == "__main__":
    main()
