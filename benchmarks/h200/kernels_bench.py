"""Our Triton kernels against the transformers paths they replace, at full size on the GPU.

For each size: the error against a float32 reference (fresh random bf16 inputs) and the time of
one call, replayed from a CUDA graph as the engine replays its decode steps (median of
`triton.testing.do_bench_cudagraph`). MoE: one layer's experts, transformers' `grouped_mm` vs
`fused_triton`. Decode attention: one layer, the gather + SDPA path over a 2048-long slot cache
vs the slot kernel, with every row holding `length` keys.

    PYTHONPATH=. python3 benchmarks/h200/kernels_bench.py --out kernels.json
"""

from __future__ import annotations

import argparse
import json
import types
from pathlib import Path

import torch
import triton.testing
from transformers.integrations.moe import grouped_mm_experts_forward
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from engine.models import fused_moe, slot_attention
from engine.models.kv_cache import SlotKVCache

MOE = {  # hidden, intermediate, experts, top-k (DESIGN.md section 3)
    "thinker": (2048, 768, 128, 8),
    "talker": (1024, 384, 128, 6),
}
ATTENTION = {"thinker": (32, 4), "talker": (16, 2)}  # query heads, key/value heads; head_dim 128


def timed(fn) -> float:
    return float(triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median"))


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def moe_rows() -> list[dict]:
    rows = []
    for stage, (hidden, inter, experts, top_k) in MOE.items():
        module = types.SimpleNamespace(
            gate_up_proj=torch.randn(experts, 2 * inter, hidden, device="cuda", dtype=torch.bfloat16) / hidden**0.5,
            down_proj=torch.randn(experts, hidden, inter, device="cuda", dtype=torch.bfloat16) / inter**0.5,
            num_experts=experts, has_gate=True, has_bias=False, is_transposed=False, _is_expert_parallel=False,
            has_post_expert_norm=False, act_fn=torch.nn.functional.silu,
        )
        module._apply_gate = lambda out: torch.nn.functional.silu(out[..., :inter]) * out[..., inter:]
        for tokens in (1, 16, 64, 512):
            x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
            weights, index = torch.topk(torch.randn(tokens, experts, device="cuda").softmax(-1), top_k)
            weights = weights / weights.sum(-1, keepdim=True)
            fused = fused_moe.fused_experts(x, module.gate_up_proj, module.down_proj, index, weights)
            grouped = grouped_mm_experts_forward(module, x, index, weights.to(x.dtype))
            row = {"stage": stage, "tokens": tokens}
            if tokens <= 16:  # the float32 pair-by-pair reference is slow
                ref = fused_moe.fused_experts_reference(x, module.gate_up_proj, module.down_proj, index, weights)
                row.update(fused_rel_err=rel(fused, ref), grouped_mm_rel_err=rel(grouped, ref))
            row["fused_vs_grouped_rel"] = rel(fused, grouped)
            row["grouped_mm_ms"] = timed(lambda: grouped_mm_experts_forward(module, x, index, weights.to(x.dtype)))
            row["fused_ms"] = timed(lambda: fused_moe.fused_experts(x, module.gate_up_proj, module.down_proj, index, weights))
            touched = int(torch.unique(index).numel())
            row["experts_touched"] = touched
            row["weight_bytes"] = touched * 3 * hidden * inter * 2
            rows.append(row)
            print(row, flush=True)
    return rows


def attention_rows(max_len: int = 2048) -> list[dict]:
    rows = []
    for stage, (heads, kv_heads) in ATTENTION.items():
        kv = SlotKVCache(num_layers=1, num_slots=64, num_kv_heads=kv_heads, head_dim=128, max_len=max_len,
                         dtype=torch.bfloat16, device="cuda")
        kv.keys[0].normal_()
        kv.values[0].normal_()
        module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=False, training=False)
        for batch in (1, 16, 64):
            for length in (160, 1024):
                slots = list(range(batch))
                q = torch.randn(batch, heads, 1, 128, device="cuda", dtype=torch.bfloat16)
                view = kv.batch(slots, [length - 1] * batch, 1)
                view.kv_len = max_len  # as in a captured graph: the whole cache, masked
                mask = view.attention_mask(torch.bfloat16)
                lengths = torch.full((batch,), length, device="cuda")
                slot_t = torch.tensor(slots, device="cuda")

                def plain():
                    k, v = kv.keys[0][view.slots, :, :max_len], kv.values[0][view.slots, :, :max_len]
                    return sdpa_attention_forward(module, q, k, v, mask, scaling=128**-0.5)[0]

                def kernel():
                    return slot_attention.decode_attention(q[:, :, 0], kv.keys[0], kv.values[0], slot_t, lengths, 128**-0.5)

                ref = slot_attention.decode_attention_reference(q[:, :, 0], kv.keys[0], kv.values[0], slot_t, lengths,
                                                                128**-0.5)
                row = {"stage": stage, "batch": batch, "length": length,
                       "kernel_rel_err": rel(kernel(), ref), "sdpa_rel_err": rel(plain()[:, 0], ref),
                       "sdpa_ms": timed(plain), "kernel_ms": timed(kernel),
                       "kv_bytes": 2 * batch * kv_heads * length * 128 * 2}
                rows.append(row)
                print(row, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    with torch.inference_mode():
        result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                  "moe": moe_rows(), "attention": attention_rows()}
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
