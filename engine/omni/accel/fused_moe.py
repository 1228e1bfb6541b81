"""Fused mixture-of-experts (Triton), as a transformers experts implementation.

transformers' `grouped_mm` path runs a dozen ops per layer around two grouped GEMMs and materialises the
gate/up product. Here each (token, expert) pair is placed in blocks of `block_m` rows of one expert; one kernel
reads an expert's gate and up rows once per block and writes SiLU(gate) * up, a second multiplies by the down
projection and the routing weight. The block layout's size depends only on the token count, so a CUDA graph
can capture it. With FP8 experts (fp8.py) each kernel's input is quantized per row and 128 columns first, and
every tile's product is e4m3 x e4m3, scaled by its row's and its weight block's scales. Runs on the GPU, or on
the CPU under `TRITON_INTERPRET=1` (how CI tests it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.omni.accel import fp8
from engine.omni.accel.triton_launch import dot_precision, interpreted, launch_guard

EXPERTS_NAME = "vg_fused_moe"
FP8_REFERENCE_NAME = "vg_fp8_reference"

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without triton: the kernels are simply unavailable
    triton = None


@dataclass(frozen=True, slots=True)
class Tiles:
    """One launch configuration of both kernels: block rows, output columns, reduction depth, warps, stages."""

    block_m: int
    block_n: int = 64
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 3


# decode: a few tokens per expert, so small blocks waste little
DECODE_TILES = Tiles(block_m=16)
# prefill: bigger blocks read each expert's weights fewer times; near the best of a sweep of launch shapes
# for both stages at short and long prompts
PREFILL_TILES = Tiles(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=4)


# FP8 prefill: deeper, narrower tiles (one block of scales deep); with bf16's PREFILL_TILES, FP8 experts are
# slower than bf16's
FP8_PREFILL_TILES = Tiles(block_m=64, block_n=64, block_k=128, num_warps=4, num_stages=4)


def default_tiles(num_pairs: int, num_experts: int, is_fp8: bool = False) -> Tiles:
    if num_pairs <= 4 * num_experts:
        return DECODE_TILES
    return FP8_PREFILL_TILES if is_fp8 else PREFILL_TILES


@dataclass(frozen=True, slots=True)
class BlockLayout:
    pair_ids: torch.Tensor  # [num_blocks * block_m] (token * top_k + k), `num_pairs` where a row is padding
    block_expert: torch.Tensor  # [num_blocks] the expert of each block; `num_experts` past the last used block
    block_m: int


def block_layout(top_k_index: torch.Tensor, num_experts: int, block_m: int) -> BlockLayout:
    """Group (token, k) pairs by expert, each expert's run padded to a multiple of `block_m`. Shapes depend only on the
    number of pairs, and nothing syncs with the host. At most min(E, pairs) experts are used, each wasting fewer than
    `block_m` rows, which bounds the padded length. A pair's place in its run is a running count over a one-hot of
    the routing, where a sort would cost a radix-sort launch per layer."""
    experts = top_k_index.reshape(-1)
    num_pairs = experts.numel()
    device = experts.device
    # [E, pairs], so the running count is a scan along each row's contiguous memory (a scan down
    # the columns of [pairs, E] is one slow kernel)
    onehot = (experts[None, :] == torch.arange(num_experts, device=device)[:, None]).to(torch.int32)
    counts = onehot.sum(1, dtype=torch.long)
    rank = (onehot.cumsum(1, dtype=torch.int32) - onehot).gather(0, experts[None, :])[0]
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    dest = (padded_end - padded)[experts] + rank
    max_rows = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    num_blocks = (max_rows + block_m - 1) // block_m
    pair_ids = torch.full((num_blocks * block_m,), num_pairs, dtype=torch.long, device=device)
    pair_ids[dest] = torch.arange(num_pairs, device=device)
    block_starts = torch.arange(num_blocks, device=device) * block_m
    block_expert = torch.searchsorted(padded_end, block_starts, right=True)
    return BlockLayout(pair_ids, block_expert, block_m)


def fused_experts_reference(
    hidden: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor, *, rows: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """The same function expert by expert in float32: hidden [T, H], gate_up [E, 2I, H], down [E, H, I] ->
    [T, H]. `rows`: what each projection's input goes through first, in `hidden`'s dtype as the kernels store it
    (FP8 experts: `fp8.round_rows`, their inputs' quantization)."""
    inter = down.shape[-1]
    through = rows or (lambda a: a.float())
    x = through(hidden)
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    for e in top_k_index.unique().tolist():
        tokens, k = (top_k_index == e).nonzero(as_tuple=True)
        gu = x[tokens] @ gate_up[e].float().T
        act = through((torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]).to(hidden.dtype))
        out.index_add_(0, tokens, top_k_weights[tokens, k].float()[:, None] * (act @ down[e].float().T))
    return out


def fp8_reference_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                          top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' experts-function signature over FP8 experts, in plain torch: what the kernels compute, up
    to the order of their sums (`enable_fp8_reference`)."""
    return fused_experts_reference(
        hidden_states, fp8.dequantize(self.gate_up_proj, self.gate_up_scale), fp8.dequantize(self.down_proj, self.down_scale),
        top_k_index, top_k_weights, rows=fp8.round_rows).to(hidden_states.dtype)


if triton is not None:

    @triton.jit(do_not_specialize=["num_rows"])
    def _quantize_rows_kernel(X, Q, S, num_rows, stride_x, stride_q, stride_s, num_cols: tl.constexpr,
                              ROWS: tl.constexpr, BLOCK: tl.constexpr, E4M3_MAX: tl.constexpr, ROUND: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = (rows < num_rows)[:, None] & (cols < num_cols)[None, :]
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        amax = tl.max(tl.abs(x), axis=1)
        scale = tl.where(amax > 0, amax * (1.0 / E4M3_MAX), 1.0)
        # a rounded division, as torch divides tensors: `/` on a GPU is a faster one, off by an ulp at times
        y = tl.minimum(tl.maximum(tl.math.div_rn(x, scale[:, None]), -E4M3_MAX), E4M3_MAX)
        if ROUND:  # Triton's interpreter rounds casts to FP8 its own way: y goes there on e4m3's grid already
            # adding 2^20 times the largest power of two under |y| (2^-6 at least: e4m3's subnormals are steps
            # of 2^-9) leaves float32 one bit for each step of e4m3 there, and float32 rounds ties to even
            bits = y.to(tl.int32, bitcast=True)
            magnitude = bits & 0x7FFFFFFF
            exponent = tl.maximum((magnitude >> 23) - 127, -6)
            magic = ((exponent + 20 + 127) << 23).to(tl.float32, bitcast=True)
            rounded = (magnitude.to(tl.float32, bitcast=True) + magic) - magic
            y = (rounded.to(tl.int32, bitcast=True) | (bits ^ magnitude)).to(tl.float32, bitcast=True)
        tl.store(Q + rows[:, None] * stride_q + cols[None, :], y.to(Q.dtype.element_ty), mask=ok)
        tl.store(S + rows * stride_s + tl.program_id(1), scale, mask=rows < num_rows)

    # the pair count changes with every batch: no recompile for its divisibility
    @triton.jit(do_not_specialize=["num_pairs"])
    def _gate_up_kernel(
        X, XScale, W, Scale, Act, PairIds, BlockExpert, num_pairs, num_experts,
        stride_xt, stride_xst, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk, stride_ap,
        hidden_dim: tl.constexpr, inter_dim: tl.constexpr, TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        PRECISION: tl.constexpr, FP8: tl.constexpr, SCALE_BLOCK: tl.constexpr,
    ):
        block = tl.program_id(0)
        expert = tl.load(BlockExpert + block)
        if expert >= num_experts:
            return
        pairs = tl.load(PairIds + block * BLOCK_M + tl.arange(0, BLOCK_M))
        real = pairs < num_pairs
        tokens = pairs // TOP_K
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < inter_dim
        ks = tl.arange(0, BLOCK_K)
        x_ptrs = X + tokens[:, None] * stride_xt + ks[None, :]
        w_base = W + expert * stride_we + ks[:, None] * stride_wk
        gate_ptrs = w_base + cols[None, :] * stride_wn
        up_ptrs = w_base + (cols + inter_dim)[None, :] * stride_wn
        gate_scales = Scale + expert * stride_se + (cols // SCALE_BLOCK) * stride_sn
        up_scales = Scale + expert * stride_se + ((cols + inter_dim) // SCALE_BLOCK) * stride_sn
        gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, hidden_dim, BLOCK_K):
            k_ok = (k0 + ks) < hidden_dim
            x = tl.load(x_ptrs, mask=real[:, None] & k_ok[None, :], other=0.0)
            w_mask = k_ok[:, None] & col_ok[None, :]
            if FP8:  # e4m3 x e4m3; the tile lies in one block of scales along k, the rows' and the weights'
                kb = k0 // SCALE_BLOCK
                rows = tl.load(XScale + tokens * stride_xst + kb, mask=real, other=0.0)[:, None]
                gate_s = tl.load(gate_scales + kb * stride_sk, mask=col_ok, other=0.0)[None, :]
                up_s = tl.load(up_scales + kb * stride_sk, mask=col_ok, other=0.0)[None, :]
                gate += tl.dot(x, tl.load(gate_ptrs, mask=w_mask, other=0.0)) * (rows * gate_s)
                up += tl.dot(x, tl.load(up_ptrs, mask=w_mask, other=0.0)) * (rows * up_s)
            else:
                gate += tl.dot(x, tl.load(gate_ptrs, mask=w_mask, other=0.0), input_precision=PRECISION)
                up += tl.dot(x, tl.load(up_ptrs, mask=w_mask, other=0.0), input_precision=PRECISION)
            x_ptrs += BLOCK_K
            gate_ptrs += BLOCK_K * stride_wk
            up_ptrs += BLOCK_K * stride_wk
        act = gate * tl.sigmoid(gate) * up
        tl.store(Act + pairs[:, None] * stride_ap + cols[None, :], act.to(Act.dtype.element_ty),
                 mask=real[:, None] & col_ok[None, :])

    @triton.jit(do_not_specialize=["num_pairs"])
    def _down_kernel(
        Act, ActScale, W, Scale, Weights, Out, PairIds, BlockExpert, num_pairs, num_experts,
        stride_ap, stride_as, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk, stride_op,
        hidden_dim: tl.constexpr, inter_dim: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        PRECISION: tl.constexpr, FP8: tl.constexpr, SCALE_BLOCK: tl.constexpr,
    ):
        block = tl.program_id(0)
        expert = tl.load(BlockExpert + block)
        if expert >= num_experts:
            return
        pairs = tl.load(PairIds + block * BLOCK_M + tl.arange(0, BLOCK_M))
        real = pairs < num_pairs
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < hidden_dim
        ks = tl.arange(0, BLOCK_K)
        a_ptrs = Act + pairs[:, None] * stride_ap + ks[None, :]
        w_ptrs = W + expert * stride_we + cols[None, :] * stride_wn + ks[:, None] * stride_wk
        scales = Scale + expert * stride_se + (cols // SCALE_BLOCK) * stride_sn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, inter_dim, BLOCK_K):
            k_ok = (k0 + ks) < inter_dim
            a = tl.load(a_ptrs, mask=real[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            if FP8:
                kb = k0 // SCALE_BLOCK
                rows = tl.load(ActScale + pairs * stride_as + kb, mask=real, other=0.0)[:, None]
                acc += tl.dot(a, w) * (rows * tl.load(scales + kb * stride_sk, mask=col_ok, other=0.0)[None, :])
            else:
                acc += tl.dot(a, w, input_precision=PRECISION)
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K * stride_wk
        weight = tl.load(Weights + pairs, mask=real, other=0.0).to(tl.float32)
        acc = acc * weight[:, None]
        tl.store(Out + pairs[:, None] * stride_op + cols[None, :], acc.to(Out.dtype.element_ty),
                 mask=real[:, None] & col_ok[None, :])


def fused_experts(
    hidden: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor, *, tiles: Tiles | None = None, gate_up_scale: torch.Tensor | None = None,
    down_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """hidden [T, H], gate_up [E, 2I, H], down [E, H, I], top_k_index/weights [T, K] -> [T, H]. FP8 experts
    (engine/omni/accel/fp8.py) come with their block scales, `gate_up_scale` [E, 2I / 128, H / 128] and
    `down_scale` [E, H / 128, I / 128]."""
    if triton is None:
        raise RuntimeError("the fused MoE path needs triton (pip install triton), or set kernels: reference")
    num_tokens, hidden_dim = hidden.shape
    num_experts, _, inter_dim = down.shape
    top_k = top_k_index.shape[1]
    num_pairs = num_tokens * top_k
    is_fp8 = gate_up_scale is not None
    tiles = tiles or default_tiles(num_pairs, num_experts, is_fp8)
    block_m, block_n, block_k = tiles.block_m, tiles.block_n, tiles.block_k
    launch = {"num_warps": tiles.num_warps, "num_stages": tiles.num_stages}
    if is_fp8:
        assert down_scale is not None and fp8.BLOCK % block_k == 0, (block_k, "a tile spans two blocks of scales")
    # unread when the weights are not FP8: any tensor passes as the pointer
    gate_up_scale = gate_up if gate_up_scale is None else gate_up_scale
    down_scale = down if down_scale is None else down_scale
    layout = block_layout(top_k_index, num_experts, block_m)
    num_blocks = layout.block_expert.numel()
    hidden = hidden.contiguous()
    x, x_scale = quantize_rows(hidden) if is_fp8 else (hidden, hidden)
    act = torch.empty(num_pairs, inter_dim, dtype=hidden.dtype, device=hidden.device)
    out = torch.empty(num_pairs, hidden_dim, dtype=hidden.dtype, device=hidden.device)
    weights = top_k_weights.reshape(-1).contiguous()
    with launch_guard():
        _gate_up_kernel[(num_blocks, triton.cdiv(inter_dim, block_n))](
            x, x_scale, gate_up, gate_up_scale, act, layout.pair_ids, layout.block_expert, num_pairs, num_experts,
            x.stride(0), x_scale.stride(0), gate_up.stride(0), gate_up.stride(1), gate_up.stride(2),
            *_scale_strides(gate_up_scale), act.stride(0), hidden_dim=hidden_dim, inter_dim=inter_dim, TOP_K=top_k,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=dot_precision(hidden.dtype), FP8=is_fp8,
            SCALE_BLOCK=fp8.BLOCK, **launch,
        )
    a, a_scale = quantize_rows(act) if is_fp8 else (act, act)
    with launch_guard():
        _down_kernel[(num_blocks, triton.cdiv(hidden_dim, block_n))](
            a, a_scale, down, down_scale, weights, out, layout.pair_ids, layout.block_expert, num_pairs, num_experts,
            a.stride(0), a_scale.stride(0), down.stride(0), down.stride(1), down.stride(2),
            *_scale_strides(down_scale), out.stride(0), hidden_dim=hidden_dim, inter_dim=inter_dim, BLOCK_M=block_m,
            BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=dot_precision(hidden.dtype), FP8=is_fp8,
            SCALE_BLOCK=fp8.BLOCK, **launch,
        )
    return out.view(num_tokens, top_k, hidden_dim).sum(dim=1)


def quantize_rows(x: torch.Tensor, rows_per_program: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """`fp8.quantize_rows` in one launch: the experts' inputs are quantized on every layer of every step, where
    its dozen torch operations (and their float32 copy of the input) would cost more than the FP8 product saves."""
    num_rows, num_cols = x.shape
    quantized = torch.empty(num_rows, num_cols, dtype=fp8.FP8, device=x.device)
    scale = torch.empty(num_rows, triton.cdiv(num_cols, fp8.BLOCK), dtype=torch.float32, device=x.device)
    with launch_guard():
        _quantize_rows_kernel[(triton.cdiv(num_rows, rows_per_program), scale.shape[1])](
            x, quantized, scale, num_rows, x.stride(0), quantized.stride(0), scale.stride(0), num_cols=num_cols,
            ROWS=rows_per_program, BLOCK=fp8.BLOCK, E4M3_MAX=fp8.E4M3_MAX, ROUND=interpreted(),
        )
    return quantized, scale


def _scale_strides(scale: torch.Tensor) -> tuple[int, int, int]:
    return scale.stride(0), scale.stride(1), scale.stride(2)


def fused_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
    """transformers' experts-function signature (gated, [gate; up], no bias); FP8 scales sit beside the weights."""
    return fused_experts(hidden_states, self.gate_up_proj, self.down_proj, top_k_index, top_k_weights,
                         gate_up_scale=getattr(self, "gate_up_scale", None), down_scale=getattr(self, "down_scale", None))


def enable(model: Any) -> None:
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    module: Any
    for module in model.modules():
        if hasattr(module, "gate_up_proj"):
            layout_ok = (getattr(module, "has_gate", True) and not getattr(module, "has_bias", False)
                         and not getattr(module, "is_transposed", False) and getattr(module, "is_concatenated", True))
            probe = torch.linspace(-4, 4, 9)
            is_silu = torch.allclose(module.act_fn(probe), torch.nn.functional.silu(probe))
            if not layout_ok or not is_silu:
                raise ValueError(f"{type(module).__name__}: the fused MoE kernels need [gate; up] weights and SiLU")
    ALL_EXPERTS_FUNCTIONS.register(EXPERTS_NAME, fused_experts_forward)
    model.set_experts_implementation(EXPERTS_NAME)


def enable_fp8_reference(model: Any) -> None:
    """Make `model`'s FP8 experts compute the kernels' arithmetic in plain torch: the reference, and the CPU's path."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if not any(fp8.is_quantized(m) for m in model.modules()):
        raise ValueError(f"{type(model).__name__} has no FP8 experts")
    ALL_EXPERTS_FUNCTIONS.register(FP8_REFERENCE_NAME, fp8_reference_forward)
    model.set_experts_implementation(FP8_REFERENCE_NAME)
