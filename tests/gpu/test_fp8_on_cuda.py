"""FP8 experts on a GPU: the compiled kernels at the released model's expert shapes against the float32 reference
of the same arithmetic (e4m3 weights and inputs, their scales); the tiny engine with `quantization: fp8`, kernels
and CUDA graphs against transformers' generate() doing that arithmetic; the accuracy report as the kernels give
it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.omni.accel import fp8, fused_moe


@pytest.mark.parametrize("num_tokens", [64, 1024])  # a decode step at batch 64, a prefill step
@pytest.mark.parametrize(("experts", "inter", "hidden"), [(128, 768, 2048), (128, 384, 1024)])  # Thinker, Talker
def test_the_kernels_on_fp8_experts_at_full_size(num_tokens: int, experts: int, inter: int, hidden: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(num_tokens)
    x = torch.randn(num_tokens, hidden, device="cuda", generator=gen).bfloat16()
    gate_up = torch.randn(experts, 2 * inter, hidden, device="cuda", generator=gen) * 0.02
    down = torch.randn(experts, hidden, inter, device="cuda", generator=gen) * 0.02
    (gate_up_q, gate_up_s), (down_q, down_s) = fp8.quantize(gate_up), fp8.quantize(down)
    del gate_up, down
    weights, index = torch.topk(torch.randn(num_tokens, experts, device="cuda", generator=gen).softmax(-1), 8)
    out = fused_moe.fused_experts(x, gate_up_q, down_q, index, weights, gate_up_scale=gate_up_s, down_scale=down_s)
    ref = fused_moe.fused_experts_reference(x, fp8.dequantize(gate_up_q, gate_up_s), fp8.dequantize(down_q, down_s),
                                            index, weights, rows=fp8.round_rows)
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_an_fp8_engine_on_cuda_equals_generate(tiny_checkpoint: Path, cache_dir: Path) -> None:
    from tests.unit.test_fp8 import check_fp8_engine_equals_generate

    check_fp8_engine_equals_generate(tiny_checkpoint, cache_dir, "cuda", {"kernels": "triton", "cuda_graphs": True})


def test_the_accuracy_report_with_the_kernels(tiny_checkpoint: Path) -> None:
    from engine.probes.accuracy import measure

    report = measure("tiny", device="cuda", steps=64, cache_dir=tiny_checkpoint.parent)
    assert report.experts_kernel == "triton"
    for stage in (report.thinker, report.talker):
        assert stage["fp8"].logits_rel_error < 2 * stage["bf16"].logits_rel_error + 1e-2
        assert stage["fp8"].top1_agreement >= 0.8
