"""Our Triton kernels against plain float32 references, on fresh random inputs.

On a CPU they run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1);
on a GPU, compiled, in bf16 as deployed.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from engine.omni.accel import fused_moe, snake  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
TOLERANCE = 2e-2 if DTYPE == torch.bfloat16 else 1e-5


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all()
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def test_block_layout_places_every_pair_once_in_its_experts_blocks() -> None:
    gen = torch.Generator().manual_seed(1)
    num_experts, block_m = 8, 4
    top_k_index = torch.stack([torch.randperm(num_experts, generator=gen)[:3] for _ in range(7)])  # [7, 3]
    top_k_index[:5, 0] = 6  # one crowded expert spans several blocks
    layout = fused_moe.block_layout(top_k_index, num_experts, block_m)
    num_pairs = top_k_index.numel()
    rows = layout.pair_ids.view(-1, block_m)
    assert rows.shape[0] == layout.block_expert.numel()
    real = layout.pair_ids[layout.pair_ids < num_pairs]
    assert sorted(real.tolist()) == list(range(num_pairs))
    flat = top_k_index.reshape(-1)
    for block, expert in zip(rows, layout.block_expert.tolist(), strict=True):
        pairs = block[block < num_pairs]
        if expert >= num_experts:
            assert pairs.numel() == 0
        else:
            assert pairs.numel() > 0 and (flat[pairs] == expert).all()
    # experts in order, and each expert's pairs in their own order: what a stable sort by expert gives
    assert torch.equal(real, torch.argsort(flat, stable=True))
    # the shape depends only on the number of pairs: a graph can hold it for any routing
    other = fused_moe.block_layout(torch.zeros_like(top_k_index), num_experts, block_m)
    assert other.pair_ids.shape == layout.pair_ids.shape and other.block_expert.shape == layout.block_expert.shape


@pytest.mark.parametrize(("num_tokens", "tiles"), [
    (1, fused_moe.Tiles(16, block_n=32, block_k=32)),
    (3, fused_moe.Tiles(16, block_n=32, block_k=32)),
    (40, fused_moe.Tiles(64, block_n=32, block_k=32)),  # 40 tokens x 2 > 4 x 8 experts: the prefill block size
    (40, fused_moe.Tiles(128, block_n=64, block_k=64, num_warps=8, num_stages=4)),  # a wider prefill launch
])
def test_fused_experts_match_reference(num_tokens: int, tiles: fused_moe.Tiles) -> None:
    gen = torch.Generator().manual_seed(num_tokens)
    num_experts, top_k, hidden, inter = 8, 2, 48, 40  # neither a multiple of the tile sizes below
    x = torch.randn(num_tokens, hidden, generator=gen).to(DEVICE, DTYPE)
    gate_up = (torch.randn(num_experts, 2 * inter, hidden, generator=gen) / hidden**0.5).to(DEVICE, DTYPE)
    down = (torch.randn(num_experts, hidden, inter, generator=gen) / inter**0.5).to(DEVICE, DTYPE)
    weights, index = torch.topk(torch.randn(num_tokens, num_experts, generator=gen).softmax(-1), top_k)
    weights, index = weights.to(DEVICE), index.to(DEVICE)
    out = fused_moe.fused_experts(x, gate_up, down, index, weights, tiles=tiles)
    ref = fused_moe.fused_experts_reference(x, gate_up, down, index, weights)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert relative_error(out, ref) < TOLERANCE


def test_fused_experts_equal_transformers_eager_experts(tiny_checkpoint) -> None:
    """Through a real Qwen3-Omni experts module: our implementation vs transformers' eager loop."""
    from engine.omni.weights.checkpoint import load_stage

    model = load_stage(tiny_checkpoint, "talker", device=DEVICE, dtype="float32").model
    experts = next(m for m in model.modules() if hasattr(m, "gate_up_proj"))
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(5, experts.gate_up_proj.shape[-1], generator=gen).to(DEVICE)
    weights, index = torch.topk(torch.randn(5, experts.num_experts, generator=gen).softmax(-1), 2)
    weights, index = weights.to(DEVICE), index.to(DEVICE)
    with torch.inference_mode():
        model.set_experts_implementation("eager")
        eager = experts(hidden, index, weights)
        fused_moe.enable(model)
        fused = experts(hidden, index, weights)
    assert model.config._experts_implementation == fused_moe.EXPERTS_NAME
    assert relative_error(fused, eager) < 1e-5


@pytest.mark.parametrize("length", [1, 37, 2500])  # one sample, a partial block, several blocks of a row
def test_snake_beta_matches_reference(length: int) -> None:
    gen = torch.Generator().manual_seed(length)
    channels = 5
    x = (3 * torch.randn(2, channels, length, generator=gen)).to(DEVICE, DTYPE)
    alpha, beta = (0.5 * torch.randn(2, channels, generator=gen)).to(DEVICE, DTYPE)  # log-scale, as stored
    out = snake.snake_beta(x, alpha, beta, 1e-9)
    ref = snake.snake_beta_reference(x, alpha, beta, 1e-9)
    assert out.shape == x.shape and out.dtype == x.dtype
    # compared with the activation's own part: the identity term alone would hide a wrong sine
    assert relative_error(out.float() - x.float(), ref - x.float()) < TOLERANCE
    # a strided input (what a transposed view hands over) gives the same result
    assert torch.equal(snake.snake_beta(x.transpose(0, 1).contiguous().transpose(0, 1), alpha, beta, 1e-9), out)


def test_fused_snake_equals_transformers_modules(tiny_checkpoint) -> None:
    """Through the real Code2Wav: every SnakeBeta module, then the whole decode, with and without the kernel."""
    from engine.omni.weights.checkpoint import load_stage

    model = load_stage(tiny_checkpoint, "code2wav", device=DEVICE, dtype="float32").model
    with torch.no_grad():  # SnakeBeta starts at alpha = beta = 0 (log-scale); perturb so both matter
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())).to(p.device) * 0.05)
    codes = torch.randint(0, 2048, (2, 16, 6), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    activations = [m for m in model.modules() if type(m).__name__.endswith("SnakeBeta")]
    x = torch.randn(2, activations[0].in_features, 9, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    with torch.inference_mode():
        plain_act, plain = activations[0](x), model(codes)
        assert snake.enable(model) == len(activations) > 1
        fused_act, fused = activations[0](x), model(codes)
    tolerance = 1e-5 if DEVICE == "cpu" else 1e-3
    assert (fused_act - plain_act).abs().max().item() <= tolerance * plain_act.abs().max().item()
    assert (fused - plain).abs().max().item() <= tolerance * max(plain.abs().max().item(), 1e-3)
