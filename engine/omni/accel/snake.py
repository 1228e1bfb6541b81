"""Code2Wav's SnakeBeta activation as one Triton kernel.

transformers computes x + sin(x * e^alpha)^2 / (e^beta + eps) as five full-size bf16 ops, each reading and
writing the whole activation. Here each element is read once, computed in float32 and written once. `enable`
points every SnakeBeta module's forward at the kernel. Runs on the GPU, or on the CPU under `TRITON_INTERPRET=1`."""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from engine.omni.accel.triton_launch import launch_guard

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without triton: the kernel is simply unavailable
    triton = None

_BLOCK = 1024


def snake_beta_reference(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, eps: float) -> torch.Tensor:
    """The same function in float32: x [B, C, T], alpha/beta [C] (log-scale) -> [B, C, T]."""
    a = alpha.float().exp()[None, :, None]
    b = beta.float().exp()[None, :, None]
    x = x.float()
    return x + torch.sin(x * a).pow(2) / (b + eps)


if triton is not None:

    # the length changes with every chunk size and batch: no recompile for its divisibility
    @triton.jit(do_not_specialize=["length"])
    def _snake_beta_kernel(X, Alpha, Beta, Out, channels, length, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)  # b * channels + c of a contiguous [B, C, T]
        channel = row % channels
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < length
        scale = tl.exp(tl.load(Alpha + channel).to(tl.float32))
        gain = 1.0 / (tl.exp(tl.load(Beta + channel).to(tl.float32)) + eps)
        offsets = row.to(tl.int64) * length + cols
        x = tl.load(X + offsets, mask=inside, other=0.0).to(tl.float32)
        wave = tl.sin(x * scale)
        tl.store(Out + offsets, (x + gain * wave * wave).to(Out.dtype.element_ty), mask=inside)


def snake_beta(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, eps: float) -> torch.Tensor:
    """x [B, C, T], alpha/beta [C] (log-scale, as the module stores them) -> [B, C, T] in x's dtype."""
    if triton is None:
        raise RuntimeError("the fused SnakeBeta needs triton (pip install triton), or set kernels: reference")
    x = x.contiguous()
    batch, channels, length = x.shape
    out = torch.empty_like(x)
    if out.numel():
        with launch_guard():
            _snake_beta_kernel[(batch * channels, triton.cdiv(length, _BLOCK))](
                x, alpha, beta, out, channels, length, eps, BLOCK=_BLOCK,
            )
    return out


def _fused_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    return snake_beta(hidden_states, self.alpha, self.beta, self.no_div_by_zero)


def enable(code2wav: nn.Module) -> int:
    if triton is None:
        raise RuntimeError("the fused SnakeBeta needs triton (pip install triton), or set kernels: reference")
    count = 0
    for module in code2wav.modules():
        if type(module).__name__.endswith("SnakeBeta"):
            module.forward = types.MethodType(_fused_forward, module)
            count += 1
    return count
