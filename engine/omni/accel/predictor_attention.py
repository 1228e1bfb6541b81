"""The code predictor's attention for one position of a frame, in one Triton kernel.

A code predictor frame is 16 positions x 5 layers of one token per row, each layer reading at most 16 keys; in
torch that is five or six tiny kernels a layer-step. Here one program per (row, key/value head) normalises and
rotates its key and its group's queries straight from the q/k/v GEMM's output, scores them against the frame's
earlier keys and the position's own, and writes the output, the key and the value. It computes in float32 and
rounds to the model's dtype where the torch step rounds before its next GEMM. Runs on the GPU, or on the CPU
under `TRITON_INTERPRET=1` (how CI tests it against the torch step)."""

from __future__ import annotations

import torch

from engine.omni.accel.triton_launch import launch_guard

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without triton: the kernel is simply unavailable
    triton = None


if triton is not None:

    @triton.jit
    def _normed_rotated(row, weight, cos, sin, dims, partner, sign, EPS: tl.constexpr, HEAD_DIM: tl.constexpr):
        """RMSNorm (transformers': the weight times the normalised row in the model's dtype), then RoPE's
        rotate-half; `row` points at one head's D values."""
        x = tl.load(row + dims).to(tl.float32)
        x_partner = tl.load(row + partner).to(tl.float32)
        inv = tl.rsqrt(tl.sum(x * x, axis=0) / HEAD_DIM + EPS)
        dtype = weight.dtype.element_ty
        # products in float32, rounded as torch rounds a product of two bf16 tensors (Triton's CPU interpreter
        # cannot multiply bf16 values themselves)
        w, w_partner = tl.load(weight + dims).to(tl.float32), tl.load(weight + partner).to(tl.float32)
        normed = (w * (x * inv).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        normed_partner = (w_partner * (x_partner * inv).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        return (normed * cos + sign * normed_partner * sin).to(dtype)

    @triton.jit
    def _predictor_attention_kernel(
        QKV, QNorm, KNorm, Cos, Sin, Position, Keys, Values, Out, NewKeys, NewValues,
        stride_qkv, stride_kb, stride_kh, stride_kp, stride_vb, stride_vh, stride_vp, stride_out,
        stride_nb, stride_nh,
        HEADS: tl.constexpr, KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
        POSITIONS: tl.constexpr, EPS: tl.constexpr, SCALE: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        kv_head = tl.program_id(1)
        dims = tl.arange(0, HEAD_DIM)
        partner = (dims + HEAD_DIM // 2) % HEAD_DIM
        sign = tl.where(dims < HEAD_DIM // 2, -1.0, 1.0)
        position = tl.load(Position)
        cos = tl.load(Cos + position * HEAD_DIM + dims).to(tl.float32)
        sin = tl.load(Sin + position * HEAD_DIM + dims).to(tl.float32)
        qkv = QKV + row * stride_qkv
        key_at = qkv + (HEADS + kv_head) * HEAD_DIM
        key = _normed_rotated(key_at, KNorm, cos, sin, dims, partner, sign, EPS, HEAD_DIM)
        value = tl.load(qkv + (HEADS + KV_HEADS + kv_head) * HEAD_DIM + dims)
        tl.store(NewKeys + row * stride_nb + kv_head * stride_nh + dims, key)
        tl.store(NewValues + row * stride_nb + kv_head * stride_nh + dims, value)
        # the frame's keys and values so far [POSITIONS, D]; positions from this one on are not written yet
        slots = tl.arange(0, POSITIONS)
        earlier = slots < position
        keys = tl.load(Keys + row * stride_kb + kv_head * stride_kh + slots[:, None] * stride_kp + dims[None, :],
                       mask=earlier[:, None], other=0.0).to(tl.float32)
        values = tl.load(Values + row * stride_vb + kv_head * stride_vh + slots[:, None] * stride_vp + dims[None, :],
                         mask=earlier[:, None], other=0.0).to(tl.float32)
        key, value = key.to(tl.float32), value.to(tl.float32)
        for g in tl.static_range(GROUP):
            head = kv_head * GROUP + g
            query = _normed_rotated(qkv + head * HEAD_DIM, QNorm, cos, sin, dims, partner, sign, EPS,
                                    HEAD_DIM).to(tl.float32)
            scores = tl.where(earlier, tl.sum(keys * query[None, :], axis=1) * SCALE, float("-inf"))
            own = tl.sum(key * query, axis=0) * SCALE
            top = tl.maximum(tl.max(scores, axis=0), own)
            weights = tl.exp(scores - top)
            own_weight = tl.exp(own - top)
            total = tl.sum(weights, axis=0) + own_weight
            out = (tl.sum(weights[:, None] * values, axis=0) + own_weight * value) / total
            tl.store(Out + row * stride_out + head * HEAD_DIM + dims, out.to(Out.dtype.element_ty))


def predictor_attention(
    qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
    position: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, num_heads: int, num_kv_heads: int, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer's attention at `position` ([1], on the device) for a token per row: qkv [B, (Hq + 2 Hkv) D];
    q_norm, k_norm [D]; cos, sin [positions, D]; keys, values [B, Hkv, positions, D], the frame's buffer, read
    before `position` only, never written. -> (output [B, Hq D], this position's key and value [B, Hkv, D]), in
    qkv's dtype. One launch, no host syncs."""
    if triton is None:
        raise RuntimeError("the code predictor's attention kernel needs triton")
    batch, head_dim, positions = qkv.shape[0], cos.shape[-1], keys.shape[2]
    assert qkv.shape[1] == (num_heads + 2 * num_kv_heads) * head_dim and qkv.stride(1) == 1, qkv.shape
    assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
    assert head_dim == triton.next_power_of_2(head_dim) and positions == triton.next_power_of_2(positions)
    assert keys.stride(-1) == 1 and values.stride(-1) == 1 and cos.is_contiguous() and sin.is_contiguous()
    out = torch.empty(batch, num_heads * head_dim, dtype=qkv.dtype, device=qkv.device)
    new_keys = torch.empty(batch, num_kv_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    new_values = torch.empty_like(new_keys)
    with launch_guard():
        _predictor_attention_kernel[(batch, num_kv_heads)](
            qkv, q_norm, k_norm, cos, sin, position, keys, values, out, new_keys, new_values,
            qkv.stride(0), keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0), values.stride(1),
            values.stride(2), out.stride(0), new_keys.stride(0), new_keys.stride(1),
            HEADS=num_heads, KV_HEADS=num_kv_heads, GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim,
            POSITIONS=positions,
            # constants, not arguments: torch.compile would pass a Python float as float64
            EPS=eps, SCALE=scale,
        )
    return out, new_keys, new_values
