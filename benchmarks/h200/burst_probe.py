"""The GPU work of a c=64 burst, alone and kernel by kernel: what to make faster before the first packets.

Three parts, each at full size with random bf16 weights:
* `moe`: the fused MoE kernels at prefill sizes (a burst's 64 prompts x 48 rows = 3072 tokens) over
  a grid of launch tiles, against transformers' `grouped_mm`. Picks the fastest tiles.
* `code2wav`: one streaming Code2Wav step at batch 64 (a 25-frame chunk, a 4-frame first chunk) as
  transformers' modules run it, with the fused SnakeBeta, and with it and cuDNN's benchmark mode.
  (Outputs differ from call to call: each step moves the slots' carried state on.)
* `prefill`: the Thinker's eager prefill of 64 prompts x 48 tokens with the default tiles (and the
  sweep's best, when `moe` ran), then with its layers compiled, with its kernels.

    PYTHONPATH=. python3 benchmarks/h200/burst_probe.py --out burst-probe.json [--parts moe,code2wav,prefill]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import time
import types
from pathlib import Path

import torch
import triton.testing

from benchmarks.h200.timing import kernels, median_wall_ms
from engine.models import fused_moe, snake
from engine.models.code2wav_stream import StreamBatch, StreamingCode2Wav
from engine.models.cuda_graphs import compiled_layers
from engine.models.full_size import build_dummy_stage
from engine.models.thinker_runner import ThinkerRunner

VARIANTS = ("plain", "fused_snake", "fused_snake+cudnn_benchmark")
MOE = {"thinker": (2048, 768, 128, 8), "talker": (1024, 384, 128, 6)}  # hidden, intermediate, experts, top-k
PROMPTS, PROMPT_LEN = 64, 48


def moe_part() -> dict:
    grid = [fused_moe.Tiles(m, n, k, w, s) for m, n, k, w, s in
            itertools.product((64, 128), (64, 128), (64, 128), (4, 8), (3, 4))]
    out: dict = {"rows": []}
    for stage, (hidden, inter, experts, top_k) in MOE.items():
        if stage == "talker":  # each tile set compiles anew per model width: the Thinker's six best only
            grid = [fused_moe.Tiles(**t["tiles"]) for t in out["rows"][-1]["tiles"][:6] if "ms" in t]
        gate_up = torch.randn(experts, 2 * inter, hidden, device="cuda", dtype=torch.bfloat16) / hidden**0.5
        down = torch.randn(experts, hidden, inter, device="cuda", dtype=torch.bfloat16) / inter**0.5
        module = types.SimpleNamespace(
            gate_up_proj=gate_up, down_proj=down, num_experts=experts, has_gate=True, has_bias=False,
            is_transposed=False, _is_expert_parallel=False, has_post_expert_norm=False, act_fn=torch.nn.functional.silu,
        )
        module._apply_gate = lambda o, i=inter: torch.nn.functional.silu(o[..., :i]) * o[..., i:]
        for tokens in (1024, 3072):
            x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
            weights, index = torch.topk(torch.randn(tokens, experts, device="cuda").softmax(-1), top_k)
            weights = weights / weights.sum(-1, keepdim=True)
            flops = 2 * tokens * top_k * 3 * hidden * inter
            row = {"stage": stage, "tokens": tokens, "tflop": flops / 1e12, "tiles": []}
            try:
                from transformers.integrations.moe import grouped_mm_experts_forward

                row["grouped_mm_ms"] = triton.testing.do_bench(
                    lambda: grouped_mm_experts_forward(module, x, index, weights.to(x.dtype)), rep=100)
            except Exception as e:  # noqa: BLE001 - a missing or failing baseline is recorded, not fatal
                row["grouped_mm_error"] = f"{type(e).__name__}: {e}"[:200]
            ref = fused_moe.fused_experts(x, gate_up, down, index, weights)
            for tiles in [fused_moe.default_tiles(tokens * top_k, experts), *grid]:
                try:
                    got = fused_moe.fused_experts(x, gate_up, down, index, weights, tiles=tiles)
                    ms = triton.testing.do_bench(
                        lambda t=tiles: fused_moe.fused_experts(x, gate_up, down, index, weights, tiles=t), rep=100)
                except Exception as e:  # noqa: BLE001 - tiles past the shared memory fail to compile
                    row["tiles"].append({"tiles": dataclasses.asdict(tiles), "error": str(e)[:120]})
                    continue
                err = float((got.float() - ref.float()).norm() / ref.float().norm())
                row["tiles"].append({"tiles": dataclasses.asdict(tiles), "ms": ms, "tflops": flops / ms / 1e9, "rel_vs_default": err})
            row["tiles"].sort(key=lambda t: t.get("ms", 1e9))
            out["rows"].append(row)
            print(stage, tokens, "grouped_mm", row.get("grouped_mm_ms"), "best", row["tiles"][:3], flush=True)
    return out


def best_tiles(moe: dict, stage: str, tokens: int) -> fused_moe.Tiles:
    row = next(r for r in moe["rows"] if r["stage"] == stage and r["tokens"] == tokens)
    return fused_moe.Tiles(**row["tiles"][0]["tiles"])


def code2wav_part() -> dict:
    model, _ = build_dummy_stage("code2wav", device="cuda", dtype="bfloat16")
    stream = StreamingCode2Wav(model, 64)
    quantizers = model.config.num_quantizers
    steps = {
        f"batch{b}_chunk{f}": StreamBatch(torch.randint(0, 2048, (b, quantizers, f), device="cuda"),
                                          torch.arange(b), torch.full((b,), f), torch.full((b,), 50))
        for b, f in ((64, 25), (64, 4), (16, 25))
    }
    out: dict = {}
    reference = {}
    with torch.inference_mode():
        for variant in VARIANTS:
            if variant == "fused_snake":
                snake.enable(model)
            torch.backends.cudnn.benchmark = "cudnn_benchmark" in variant
            row = {}
            for name, step in steps.items():
                wav, _ = stream.decode(step)
                if variant == "plain":
                    reference[name] = wav.float()
                rel = float((wav.float() - reference[name]).norm() / reference[name].norm())
                row[name] = {"wall_ms": median_wall_ms(lambda s=step: stream.decode(s), iters=5), "rel_vs_plain": rel}
                if name.startswith("batch64") and variant in ("plain", "fused_snake+cudnn_benchmark"):
                    row[name].update(kernels(lambda s=step: stream.decode(s)))
            out[variant] = row
            print(variant, {k: round(v["wall_ms"], 2) for k, v in row.items()}, flush=True)
    torch.backends.cudnn.benchmark = False
    return out


def prefill_part(tiles: fused_moe.Tiles | None) -> dict:
    thinker, config = build_dummy_stage("thinker", device="cuda", dtype="bfloat16")
    fused_moe.enable(thinker)
    runner = ThinkerRunner(thinker, config, max_batch=PROMPTS, max_len=256)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 150000, (PROMPT_LEN,), generator=gen).tolist() for _ in range(PROMPTS)]
    slots = list(range(PROMPTS))

    def prefill():
        return runner.prefill(slots, prompts, [[] for _ in prompts], want_hidden=True)

    out = {}
    default = fused_moe.PREFILL_TILES
    with torch.inference_mode():
        for name, t in (("default_tiles", default), ("best_tiles", tiles)):
            if t is None:
                continue
            fused_moe.PREFILL_TILES = t
            out[name] = {"tiles": dataclasses.asdict(t), "wall_ms": median_wall_ms(prefill, iters=5), **kernels(prefill)}
            print("prefill", name, round(out[name]["wall_ms"], 1), flush=True)
        fused_moe.PREFILL_TILES = default
        # what `compile_prefill` captures: the same layers through torch.compile (GPU time is what a graph keeps)
        started = time.perf_counter()
        with compiled_layers(runner.text_model.layers):
            prefill()
            compile_s = time.perf_counter() - started
            out["default_tiles_compiled"] = {"tiles": dataclasses.asdict(default), "compile_s": compile_s,
                                             "wall_ms": median_wall_ms(prefill, iters=5), **kernels(prefill)}
        print("prefill compiled", round(out["default_tiles_compiled"]["gpu_ms"], 1), "GPU ms;",
              round(compile_s, 1), "s to compile", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parts", default="moe,code2wav,prefill")
    args = parser.parse_args()
    parts = args.parts.split(",")
    torch.manual_seed(0)
    result: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}

    def save() -> None:
        args.out.write_text(json.dumps(result, indent=1))

    with torch.inference_mode():
        if "moe" in parts:
            result["moe"] = moe_part()
            save()
    if "code2wav" in parts:
        result["code2wav"] = code2wav_part()
        save()
    if "prefill" in parts:
        tiles = best_tiles(result["moe"], "thinker", PROMPTS * PROMPT_LEN) if "moe" in result else None
        result["prefill"] = prefill_part(tiles)
        save()


if __name__ == "__main__":
    main()
