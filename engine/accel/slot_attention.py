"""Decode attention straight from the slot KV cache (a Triton kernel), as a transformers attention function.

The plain path gathers every row's keys up to the batch's longest length (a CUDA
graph must use the cache's whole length), repeats them for each query head of a
group and runs SDPA over that copy: at batch 64 with a 2048-long cache that is
gigabytes of traffic per layer for keys nobody wrote. The kernel reads each row's
own slot, only up to that row's length, once per key/value head (all the query
heads of a group share the read). One program per (row, key/value head), an
online softmax over blocks of keys.

`enable(model)` registers the function under `ATTENTION_NAME` and sets it on the
model; the runner passes its `SlotBatch` as `slot_view`, and the cache hands back
its whole buffers instead of a gathered copy (`SlotKVCache.decode_kernel`). Any
other forward (prefill, the audio encoder) falls through to SDPA unchanged.
Runs on the GPU, or on the CPU under `TRITON_INTERPRET=1` (how CI tests it).
"""

from __future__ import annotations

from typing import Any

import torch

from engine.accel.triton_launch import dot_precision, launch_guard

ATTENTION_NAME = "vg_slot_decode"

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without triton: the kernel is simply unavailable
    triton = None


def decode_attention_reference(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """What the kernel computes, row by row in float32: query [B, Hq, D], keys [S, Hkv, L, D] -> [B, Hq, D]."""
    out = torch.empty(query.shape, dtype=torch.float32, device=query.device)
    group = query.shape[1] // keys.shape[1]
    for b in range(query.shape[0]):
        n = int(lengths[b])
        k = keys[int(slots[b]), :, :n].float().repeat_interleave(group, dim=0)  # [Hq, n, D]
        v = values[int(slots[b]), :, :n].float().repeat_interleave(group, dim=0)
        weights = torch.softmax(torch.einsum("hd,hnd->hn", query[b].float(), k) * scale, dim=-1)
        out[b] = torch.einsum("hn,hnd->hd", weights, v)
    return out


if triton is not None:

    @triton.jit
    def _decode_kernel(
        Q, K, V, Out, Slots, Lengths,
        stride_qb, stride_qh, stride_ks, stride_kh, stride_kl, stride_vs, stride_vh, stride_vl,
        stride_ob, stride_oh,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
        PRECISION: tl.constexpr, SCALE: tl.constexpr,
    ):
        row = tl.program_id(0)
        kv_head = tl.program_id(1)
        slot = tl.load(Slots + row)
        length = tl.load(Lengths + row)
        heads = kv_head * GROUP + tl.arange(0, GROUP_PAD)
        real_head = tl.arange(0, GROUP_PAD) < GROUP
        dims = tl.arange(0, HEAD_DIM)
        q = tl.load(Q + row * stride_qb + heads[:, None] * stride_qh + dims[None, :], mask=real_head[:, None], other=0.0)
        k_base = K + slot * stride_ks + kv_head * stride_kh
        v_base = V + slot * stride_vs + kv_head * stride_vh
        m = tl.full((GROUP_PAD,), float("-inf"), dtype=tl.float32)
        total = tl.zeros((GROUP_PAD,), dtype=tl.float32)
        acc = tl.zeros((GROUP_PAD, HEAD_DIM), dtype=tl.float32)
        start = 0
        while start < length:  # a while loop, not range(): Triton's CPU interpreter cannot range over a loaded value
            pos = start + tl.arange(0, BLOCK_N)
            inside = pos < length
            k = tl.load(k_base + pos[:, None] * stride_kl + dims[None, :], mask=inside[:, None], other=0.0)
            v = tl.load(v_base + pos[:, None] * stride_vl + dims[None, :], mask=inside[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * SCALE  # [GROUP_PAD, BLOCK_N] in float32
            scores = tl.where(inside[None, :], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            p = tl.exp(scores - m_new[:, None])
            alpha = tl.exp(m - m_new)
            total = total * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m = m_new
            start += BLOCK_N
        out = acc / total[:, None]
        tl.store(Out + row * stride_ob + heads[:, None] * stride_oh + dims[None, :],
                 out.to(Out.dtype.element_ty), mask=real_head[:, None])


def decode_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor,
    scale: float, *, block_n: int = 64,
) -> torch.Tensor:
    """query [B, Hq, D] (one token per row), keys/values [S, Hkv, L, D], slots/lengths [B] -> [B, Hq, D]."""
    if triton is None:
        raise RuntimeError("decode attention needs triton (pip install triton), or set kernels: reference")
    batch, num_heads, head_dim = query.shape
    num_kv_heads = keys.shape[1]
    group = num_heads // num_kv_heads
    assert keys.stride(-1) == 1 and values.stride(-1) == 1 and query.stride(-1) == 1
    out = torch.empty_like(query)
    with launch_guard():
        _decode_kernel[(batch, num_kv_heads)](
            query, keys, values, out, slots, lengths,
            query.stride(0), query.stride(1), keys.stride(0), keys.stride(1), keys.stride(2),
            values.stride(0), values.stride(1), values.stride(2), out.stride(0), out.stride(1),
            GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim, BLOCK_N=block_n,
            # a constant, not an argument: torch.compile would pass a Python float as float64
            PRECISION=dot_precision(query.dtype), SCALE=scale,
        )
    return out


def slot_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function signature; decode steps of a kernel-enabled cache take the kernel."""
    view = kwargs.get("slot_view")
    if view is not None and view.uses_kernel:
        # query [B, Hq, 1, D]; key/value are the cache's whole buffers [S, Hkv, L, D]
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = decode_attention(query[:, :, 0], key, value, view.slots, view.starts + 1, scale)
        return out.unsqueeze(1), None  # [B, 1, Hq, D], the layout SDPA's path returns
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)


def enable(model: Any) -> None:
    """Register the attention function and make `model` (a text decoder) call it."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, slot_attention_forward)
    model.config._attn_implementation = ATTENTION_NAME
