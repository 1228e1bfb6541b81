"""The Talker's code predictor, one frame (15 dependent passes), in each form the engine has.

Full-size Talker with random bf16 weights, alone on the GPU. For each form, eager and replayed
from a CUDA graph: the median wall time of one frame at batch 1, 16 and 64; the CUDA kernels one
eager frame launches, their summed GPU time and the twelve that take the most of it; and how many
codes equal those of transformers' eager predictor for the same inputs and seeds (half the rows
greedy, half sampled). bf16 rounds
differently when kernels are fused, so a near-tie can flip a code: the fraction is recorded,
not asserted (the exact-equality tests run in float32, tests/unit/test_static_predictor.py).

    PYTHONPATH=. python3 benchmarks/h200/predictor_bench.py --out predictor-bench.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.h200.timing import kernels, median_wall_ms
from engine.models.cuda_graphs import GraphedCodePredictor
from engine.models.full_size import build_dummy_stage
from engine.models.sampler import RowSampling, RowTensors
from engine.models.static_predictor import StaticCodePredictor
from engine.models.talker_runner import TalkerRunner

BATCHES = (1, 16, 64)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    talker, config = build_dummy_stage("talker", device="cuda", dtype="bfloat16")
    hidden = config.thinker_config.text_config.hidden_size
    with torch.inference_mode():
        runner = TalkerRunner(talker, config, torch.randn(3, hidden), max_batch=64, max_len=64)
        width = runner.codec_embedding.embedding_dim
        gen = torch.Generator(device="cuda").manual_seed(0)
        inputs = {}
        for batch in BATCHES:
            rows = [RowSampling(0.9 if b % 2 else 0.0, 0.8, 50, seed=b, draws=3) for b in range(batch)]
            inputs[batch] = (torch.randn(batch, width, device="cuda", dtype=torch.bfloat16, generator=gen),
                             torch.randint(0, 2048, (batch,), device="cuda", generator=gen),
                             RowTensors.of(rows, "cuda"))
        reference = {b: runner.predict_residuals(*inputs[b])[0] for b in BATCHES}
        forms = {"transformers": None}
        results = []
        for name in ("transformers", "static", "compiled"):
            if name != "transformers":
                t0 = time.perf_counter()
                forms[name] = StaticCodePredictor(runner.predictor, runner.codec_embedding, compiled=name == "compiled")
                runner.static_predictor = forms[name]
                runner.predict_residuals(*inputs[64])
                runner.predict_residuals(*inputs[1])
                torch.cuda.synchronize()
                first_calls_s = time.perf_counter() - t0
            else:
                first_calls_s = 0.0
            runner.static_predictor = forms[name]
            t0 = time.perf_counter()
            graphed = GraphedCodePredictor(runner, buckets=BATCHES)
            capture_s = time.perf_counter() - t0
            for batch in BATCHES:
                past, code0, rows = inputs[batch]
                codes = runner.predict_residuals(past, code0, rows)[0]
                graphed_codes = graphed(past, code0, rows)[0]
                row = {
                    "form": name, "batch": batch,
                    "eager_ms": median_wall_ms(lambda: runner.predict_residuals(past, code0, rows), 20, 3),
                    "graphed_ms": median_wall_ms(lambda: graphed(past, code0, rows), 20, 3),
                    **kernels(lambda: runner.predict_residuals(past, code0, rows)),
                    "codes_equal_reference": float((codes == reference[batch]).float().mean()),
                    "graphed_codes_equal_eager": float((graphed_codes == codes).float().mean()),
                    "first_calls_s": round(first_calls_s, 1), "capture_s": round(capture_s, 1),
                }
                results.append(row)
                print(row, flush=True)
            graphed = None  # its graphs and memory pool go before the next form is captured
    args.out.write_text(json.dumps({
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "command": "PYTHONPATH=. python3 benchmarks/h200/predictor_bench.py --out predictor-bench.json",
        "rows": results,
    }, indent=1))


if __name__ == "__main__":
    main()
