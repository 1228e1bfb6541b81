"""FP8 experts: e4m3 weights with one float32 scale per 128 x 128 block, as Qwen's and DeepSeek's FP8 checkpoints
store them (`weight_scale_inv`), read by the fused MoE kernels. A step costs the Thinker about one read of its
experts, which e4m3 halves, and FP8 tensor cores do twice bf16's work. The inputs are quantized as they arrive
(`quantize_rows`: a scale per row and 128 columns), so each tile's product is e4m3 x e4m3 (a tile never spans two
blocks); widening e4m3 weights to bf16 in registers costs more than the halved read saves. A block's scale is
its largest magnitude over 448 (e4m3's largest). Dummy weights are quantized the same way at load."""

from __future__ import annotations

from typing import Any

import torch

BLOCK = 128
E4M3_MAX = 448.0
FP8 = torch.float8_e4m3fn


def quantize(weight: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., N, K] -> (e4m3, float32 scales [..., N / block, K / block] rounded up); a block of zeros gets scale 1."""
    *lead, n, k = weight.shape
    rows, cols = -n % block, -k % block
    padded = torch.nn.functional.pad(weight.float(), (0, cols, 0, rows))
    blocks = padded.view(*lead, (n + rows) // block, block, (k + cols) // block, block)
    amax = blocks.abs().amax(dim=(-3, -1), keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    quantized = (blocks / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    quantized = quantized.view(*lead, n + rows, k + cols)[..., :n, :k].contiguous()
    return quantized, scale.squeeze(-1).squeeze(-2).contiguous()


def quantize_rows(x: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations [T, K] -> (e4m3 [T, K], float32 scales [T, ceil(K / block)]): one scale per row and block of
    columns, taken from the values themselves (no host sync: a CUDA graph captures it)."""
    t, k = x.shape
    groups = torch.nn.functional.pad(x.float(), (0, -k % block)).view(t, -1, block)
    amax = groups.abs().amax(dim=-1, keepdim=True)
    # times the reciprocal, not over 448: a CUDA tensor divided by a number is multiplied by its reciprocal,
    # a CPU one divided; this is the same on both, and in the kernels (engine/omni/accel/fused_moe.py)
    scale = torch.where(amax > 0, amax * (1 / E4M3_MAX), torch.ones_like(amax))
    quantized = (groups / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8).view(t, -1)[:, :k].contiguous()
    return quantized, scale.squeeze(-1)


def round_rows(x: torch.Tensor) -> torch.Tensor:
    """What `quantize_rows` makes of activations, in float32 (the kernels' arithmetic, for a reference)."""
    quantized, scale = quantize_rows(x)
    return quantized.float() * scale.repeat_interleave(BLOCK, dim=-1)[:, : x.shape[1]]


def dequantize(quantized: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32,
               block: int = BLOCK) -> torch.Tensor:
    n, k = quantized.shape[-2:]
    full = scale.repeat_interleave(block, dim=-2).repeat_interleave(block, dim=-1)[..., :n, :k]
    return (quantized.float() * full).to(dtype)


def quantize_experts(model: Any) -> int:
    """Every experts module of `model` ([gate; up] and down projections) to e4m3 with block scales, in place
    (`gate_up_scale`, `down_scale` beside them); one module at a time, so memory peaks at one module's bf16
    copy. -> the bytes the experts hold now."""
    held = 0
    for module in _experts(model):
        for name in ("gate_up_proj", "down_proj"):
            held += _replace(module, name, getattr(module, name).detach())
    return held


def random_experts(model: Any, *, std: float, device: str | torch.device) -> int:
    """Dummy FP8 experts: every experts module's weights, left on the meta device at build
    (engine/omni/weights/full_size.py), drawn from N(0, std) as the bf16 dummy weights are, then quantized as
    `quantize_experts` does, one weight at a time on `device`. -> the bytes the experts hold."""
    held = 0
    for module in _experts(model):
        for name in ("gate_up_proj", "down_proj"):
            unmade = getattr(module, name)
            assert unmade.is_meta, f"{type(module).__name__}.{name} already holds weights"
            weight = torch.empty(unmade.shape, dtype=unmade.dtype, device=device).normal_(0.0, std)
            held += _replace(module, name, weight)
    return held


def _experts(model: Any) -> list[Any]:
    experts = [module for module in model.modules() if hasattr(module, "gate_up_proj")]
    if not experts:
        raise ValueError(f"{type(model).__name__} has no experts to quantize")
    return experts


def _replace(module: Any, name: str, weight: torch.Tensor) -> int:
    """`module.name` <- e4m3 of `weight`, its scales beside it (`gate_up_scale`, `down_scale`); -> their bytes."""
    quantized, scale = quantize(weight)
    setattr(module, name, torch.nn.Parameter(quantized, requires_grad=False))
    module.register_buffer(name.replace("_proj", "_scale"), scale)
    return quantized.numel() + scale.numel() * scale.element_size()


def is_quantized(module: Any) -> bool:
    return getattr(module, "gate_up_proj", None) is not None and module.gate_up_proj.dtype == FP8
