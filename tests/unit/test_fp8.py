"""FP8 experts (engine/omni/accel/fp8.py): block and row quantization's documented scales and round trip, and the fused
MoE kernels on e4m3 weights and inputs against the float32 reference of the same arithmetic.

On a CPU the kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1); on a GPU,
compiled, in bf16 as deployed."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

from engine.omni.accel import fp8, fused_moe

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32


def test_block_scales_are_each_blocks_largest_magnitude_over_448() -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(3, 300, 200, generator=gen) * 0.02  # blocks of 128 with ragged edges on both sides
    weight[1, :128, :128] = 0  # a block of zeros
    quantized, scale = fp8.quantize(weight)
    assert quantized.dtype == torch.float8_e4m3fn and quantized.shape == weight.shape
    assert scale.dtype == torch.float32 and scale.shape == (3, 3, 2)
    for e, i, j in [(0, 0, 0), (2, 2, 1), (0, 1, 1)]:
        block = weight[e, 128 * i : 128 * (i + 1), 128 * j : 128 * (j + 1)]
        assert scale[e, i, j] == pytest.approx(float(block.abs().max()) / 448, rel=1e-6)
        assert quantized[e, 128 * i : 128 * (i + 1), 128 * j : 128 * (j + 1)].float().abs().max() == 448
    assert scale[1, 0, 0] == 1 and quantized[1, :128, :128].float().abs().max() == 0


def test_round_trip_is_within_e4m3s_precision() -> None:
    """e4m3 keeps 3 mantissa bits: a weight comes back within 1/16 of itself, or of its block's smallest
    normal step for the tiniest ones."""
    weight = torch.randn(2, 256, 384, generator=torch.Generator().manual_seed(1)) * 0.02
    quantized, scale = fp8.quantize(weight)
    back = fp8.dequantize(quantized, scale)
    step = scale.repeat_interleave(128, -2).repeat_interleave(128, -1) * 2.0**-9  # e4m3's subnormal step
    assert ((back - weight).abs() <= weight.abs() / 16 + step).all()
    relative = float((back - weight).norm() / weight.norm())
    assert 0.005 < relative < 0.03  # rounding happened, and only that


def test_activations_take_a_scale_per_row_and_128_columns() -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 300, generator=gen)  # 300 columns: blocks of 128, 128 and 44
    x[:, 128:256] *= 50
    x[3] = 0
    quantized, scale = fp8.quantize_rows(x)
    assert quantized.dtype == torch.float8_e4m3fn and quantized.shape == x.shape and scale.shape == (5, 3)
    for t, j in [(0, 0), (1, 1), (4, 2)]:
        assert scale[t, j] == pytest.approx(float(x[t, 128 * j : 128 * (j + 1)].abs().max()) / 448, rel=1e-6)
    assert (scale[3] == 1).all() and quantized[3].float().abs().max() == 0
    back = fp8.round_rows(x)
    step = scale.repeat_interleave(128, -1)[:, :300] * 2.0**-9
    assert ((back - x).abs() <= x.abs() / 16 + step).all()


@pytest.mark.parametrize("num_rows", [1, 5, 37])
def test_the_row_quantization_kernel_is_the_documented_one(num_rows: int) -> None:
    """The experts' one-launch quantization of their inputs gives `fp8.quantize_rows`'s codes and scales exactly:
    the references compare with that arithmetic (and the interpreter's casts to FP8 round otherwise). 300 columns:
    blocks of 128, 128 and 44; a row of zeros."""
    pytest.importorskip("triton")
    gen = torch.Generator().manual_seed(num_rows)
    x = torch.randn(num_rows, 300, generator=gen)
    x[:, 128:256] *= 50
    x[0, :3] = torch.tensor([-0.0, 1e-5, -3e-5])  # e4m3's signed zero and its subnormals
    x[num_rows // 2] = 0
    x = x.to(DEVICE, DTYPE)
    quantized, scale = fused_moe.quantize_rows(x)
    expected, expected_scale = fp8.quantize_rows(x)
    assert quantized.dtype == expected.dtype and scale.shape == expected_scale.shape
    torch.testing.assert_close(scale, expected_scale, rtol=0, atol=0)
    assert torch.equal(quantized.view(torch.uint8), expected.view(torch.uint8))


def test_quantize_experts_replaces_every_experts_weights(tiny_checkpoint) -> None:
    from engine.omni.weights.checkpoint import load_stage

    model = load_stage(tiny_checkpoint, "talker", device="cpu", dtype="float32").model
    modules = [m for m in model.modules() if hasattr(m, "gate_up_proj")]
    before = [(m.gate_up_proj.detach().clone(), m.down_proj.detach().clone()) for m in modules]
    held = fp8.quantize_experts(model)
    assert held > 0 and all(fp8.is_quantized(m) for m in modules)
    for m, (gate_up, down) in zip(modules, before, strict=True):
        torch.testing.assert_close(fp8.dequantize(m.gate_up_proj, m.gate_up_scale), gate_up, rtol=0.07, atol=1e-6)
        torch.testing.assert_close(fp8.dequantize(m.down_proj, m.down_scale), down, rtol=0.07, atol=1e-6)


@pytest.mark.parametrize("stage", ["thinker", "talker"])
def test_dummy_fp8_experts_are_drawn_straight_into_e4m3(stage: str) -> None:
    """`load_format: dummy` with FP8: the experts are built unmade (meta) and drawn into e4m3 one weight at a
    time, with the documented scales (each block's largest magnitude over 448, so its largest code is 448) and
    the bf16 dummy weights' spread; the rest of the stage is made as without FP8."""
    from engine.omni.weights.checkpoint import stage_class
    from engine.omni.weights.full_size import experts_on_meta_device
    from engine.omni.weights.omni_config import omni_config
    from engine.omni.weights.tiny import tiny_config_dict

    cls, config = stage_class(stage, omni_config(tiny_config_dict()))
    with experts_on_meta_device():
        model = cls._from_config(config, dtype=torch.bfloat16)
    modules = [m for m in model.modules() if hasattr(m, "gate_up_proj")]
    assert modules and all(m.gate_up_proj.is_meta and m.down_proj.is_meta for m in modules)
    assert not any(p.is_meta for n, p in model.named_parameters() if not n.endswith("_proj") or "experts" not in n)
    torch.manual_seed(0)
    held = fp8.random_experts(model, std=0.02, device="cpu")
    assert held == sum(m.gate_up_proj.numel() + m.down_proj.numel() + 4 * (m.gate_up_scale.numel() + m.down_scale.numel())
                       for m in modules)
    for m in modules:
        for weight, scale in ((m.gate_up_proj, m.gate_up_scale), (m.down_proj, m.down_scale)):
            assert weight.dtype == fp8.FP8 and not weight.is_meta and scale.dtype == torch.float32
            back = fp8.dequantize(weight, scale)
            blocks = torch.nn.functional.pad(back, (0, -back.shape[-1] % 128, 0, -back.shape[-2] % 128))
            amax = blocks.unflatten(-1, (-1, 128)).unflatten(-3, (-1, 128)).abs().amax(dim=(-3, -1))
            torch.testing.assert_close(scale, amax / 448, rtol=1e-6, atol=0)
            assert 0.018 < float(back.std()) < 0.022
    with pytest.raises(AssertionError, match="already holds weights"):
        fp8.random_experts(model, std=0.02, device="cpu")


@pytest.mark.parametrize(("num_tokens", "block_m", "block_k"), [(3, 16, 32), (40, 64, 64), (40, None, None)])
def test_fused_experts_on_fp8_weights_match_the_reference(num_tokens: int, block_m: int | None,
                                                         block_k: int | None) -> None:
    """Dimensions across several 128-blocks of scales, and not multiples of them: each tile reads its own
    block's scale. No tiles given: FP8's own for prefill (80 pairs over 4 experts)."""
    pytest.importorskip("triton")
    gen = torch.Generator().manual_seed(num_tokens)
    num_experts, top_k, hidden, inter = 4, 2, 288, 200
    x = torch.randn(num_tokens, hidden, generator=gen).to(DEVICE, DTYPE)
    gate_up = torch.randn(num_experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    down = torch.randn(num_experts, hidden, inter, generator=gen) / inter**0.5
    gate_up[:, :, 128:256] *= 8  # blocks of other scales
    down[:, 128:, :] *= 0.1
    (gate_up_q, gate_up_s), (down_q, down_s) = fp8.quantize(gate_up), fp8.quantize(down)
    weights, index = torch.topk(torch.randn(num_tokens, num_experts, generator=gen).softmax(-1), top_k)
    tiles = fused_moe.Tiles(block_m, block_n=64, block_k=block_k) if block_m and block_k else None
    assert tiles or fused_moe.default_tiles(num_tokens * top_k, num_experts, True) == fused_moe.FP8_PREFILL_TILES
    out = fused_moe.fused_experts(x, gate_up_q.to(DEVICE), down_q.to(DEVICE), index.to(DEVICE), weights.to(DEVICE),
                                  tiles=tiles, gate_up_scale=gate_up_s.to(DEVICE), down_scale=down_s.to(DEVICE))
    ref = fused_moe.fused_experts_reference(x, fp8.dequantize(gate_up_q, gate_up_s).to(DEVICE),
                                            fp8.dequantize(down_q, down_s).to(DEVICE), index.to(DEVICE),
                                            weights.to(DEVICE), rows=fp8.round_rows)
    error = float((out.float() - ref).norm() / ref.norm())
    assert out.dtype == DTYPE and error < (2e-2 if DTYPE == torch.bfloat16 else 1e-5)


def check_fp8_engine_equals_generate(tiny_checkpoint, cache_dir, device: str, top: dict) -> None:
    """A reply of an engine on FP8 experts (profile keys `top` beside `quantization: fp8`) equals the tokens and
    speech of transformers' generate() on the weights they stand for, dequantized, in float32."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from tests.equivalence import assert_equals_generate
    from tests.unit.test_vision import CONVERSATIONS, _engine, _reply

    async def run():
        engine = _engine(cache_dir, device, {**top, "quantization": "fp8"})
        await engine.start()
        try:
            messages = CONVERSATIONS["text only"]
            return engine.intake.prompts.build(messages), await _reply(engine, "fp8", messages)
        finally:
            await engine.stop()

    prompt, (tokens, audio, _) = asyncio.run(run())
    reference = Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_checkpoint).to(device).eval()
    for stage in (reference.thinker, reference.talker):
        fp8.quantize_experts(stage)
        fused_moe.enable_fp8_reference(stage)
    assert_equals_generate(reference, device, prompt.token_ids, tokens, audio)


@pytest.mark.filterwarnings("ignore:Passing `repetition_penalty`:UserWarning")
def test_an_engine_on_fp8_experts_equals_generate_on_the_weights_they_stand_for(tiny_checkpoint, cache_dir) -> None:
    """`quantization: fp8` end to end, the kernels in Triton's interpreter."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton on a CPU: interpreter only (the GPU lane runs it compiled)")
    check_fp8_engine_equals_generate(tiny_checkpoint, cache_dir, "cpu", {"kernels": "triton"})


def test_fp8_needs_the_triton_kernels() -> None:
    from engine.profile import ProfileError, load_profile

    with pytest.raises(ProfileError, match="quantization: fp8 needs kernels: triton"):
        load_profile(model="tiny", platform="cpu", overrides={"quantization": "fp8"})
    with pytest.raises(ProfileError, match="must be one of none, fp8"):
        load_profile(model="tiny", platform="cpu", overrides={"quantization": "int4", "kernels": "triton"})
