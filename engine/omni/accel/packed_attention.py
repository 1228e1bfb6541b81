"""Varlen attention over packed tokens straight from the paged KV cache (a Triton kernel).

A packed step carries decode rows (one query token per speaking reply) and prefill pieces as unpadded tokens
`[T]`, whose K/V the step has already written into their sequences' pages: query i of a sequence that held
`start` keys sees keys 0..start+i. A key block lies in one page (the page size is a multiple of it); nothing is
gathered or repeated per head. The host lays out two work lists (packed_batch.py's `block_tables`): sequences of
up to `SMALL_Q` tokens one block each in the small table, longer ones in `BLOCK_Q`-token blocks in the big one.
One program per (block, key/value head) packs the block's tokens x the group's query heads into one tile (the
group shares each key read) and runs an online softmax up to the block's last causal position. Each table gets
its own tile size: a decode row alone in a 16-token tile leaves 15/16 of it idle. The tables are -1-padded
tensors, so a CUDA graph holds them for any mix. Few decode rows over long contexts split their keys into shares,
merged by a second kernel (`shares_for`). Runs on the GPU, or on the CPU under `TRITON_INTERPRET=1`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.omni.accel.triton_launch import dot_precision, interpreted, launch_guard
from engine.omni.runners.packed_batch import SMALL_Q

if TYPE_CHECKING:
    from engine.omni.runners.packed_batch import PackedBatch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without triton: the kernel is simply unavailable
    triton = None

BLOCK_Q = 16  # query tokens per big-table block: with one head per row, the smallest tile tl.dot takes
MIN_ROWS = 16  # the smallest tile tl.dot takes: a small block of a narrow group pads its rows up to it


if triton is not None:

    @triton.jit
    def _key_block(q, K, V, pages, key_start, end, position, m, total, acc, dims, stride_ks, stride_kl, stride_vs,
                   stride_vl, BLOCK_N: tl.constexpr, PAGE: tl.constexpr, PRECISION: tl.constexpr, SCALE: tl.constexpr):
        """One block of keys into the online softmax: (m, total, acc) -> the same after keys key_start..; `K`,
        `V` at the sequence's key/value head, `pages` its page list."""
        page = tl.load(pages + key_start // PAGE).to(tl.int64)  # page * stride can pass 2**31 in a large cache
        pos = key_start + tl.arange(0, BLOCK_N)
        inside = pos < end
        at = (pos % PAGE)[:, None]
        k = tl.load(K + page * stride_ks + at * stride_kl + dims[None, :], mask=inside[:, None], other=0.0)
        v = tl.load(V + page * stride_vs + at * stride_vl + dims[None, :], mask=inside[:, None], other=0.0)
        # scores in log2 units: exp2 is the hardware's instruction, exp costs a multiply more
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * (SCALE * 1.4426950408889634)
        scores = tl.where(pos[None, :] <= position[:, None], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        # a row that has seen no key yet (a split of the keys past its position) keeps m = -inf: subtract 0
        # there, not -inf, so that nothing computes -inf - -inf
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(scores - m_safe[:, None])
        alpha = tl.exp2(m - m_safe)
        total = total * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        return m_new, total, acc

    @triton.jit
    def _packed_kernel(
        Q, K, V, Out, SeqPages, SeqStart, SeqQ0, SeqLen, BlockSeq, BlockQ, PartAcc, PartM, PartTotal,
        stride_qt, stride_qh, stride_ks, stride_kh, stride_kl, stride_vs, stride_vh, stride_vl,
        stride_ot, stride_oh, stride_pages,
        PAGE: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, ROWS: tl.constexpr,
        SINGLE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
        SCALE: tl.constexpr, PIPELINED: tl.constexpr, SPLITS: tl.constexpr,
    ):
        block = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        seq = tl.load(BlockSeq + block)
        if seq < 0:  # graph padding: no work
            return
        if SINGLE:  # the small table: one block per sequence, from its first query (BlockQ is unused)
            first = seq * 0
        else:
            first = tl.load(BlockQ + block)
        pages = SeqPages + seq * stride_pages
        start = tl.load(SeqStart + seq)
        q0 = tl.load(SeqQ0 + seq)
        length = tl.load(SeqLen + seq)
        # row r of the tile: query token first + r // GROUP_PAD of the block, head r % GROUP_PAD of the group;
        # rows past BLOCK_Q * GROUP_PAD only pad a small tile up to MIN_ROWS
        rows = tl.arange(0, ROWS)
        token = first + rows // GROUP_PAD
        heads = kv_head * GROUP + rows % GROUP_PAD
        real = (rows < BLOCK_Q * GROUP_PAD) & (token < length) & (rows % GROUP_PAD < GROUP)
        position = start + token  # each row's own causal end (inclusive)
        dims = tl.arange(0, HEAD_DIM)
        q_rows = (q0 + token).to(tl.int64)
        q = tl.load(Q + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                    mask=real[:, None], other=0.0)
        k_head = K + kv_head * stride_kh
        v_head = V + kv_head * stride_vh
        m = tl.full((ROWS,), float("-inf"), dtype=tl.float32)
        total = tl.zeros((ROWS,), dtype=tl.float32)
        acc = tl.zeros((ROWS, HEAD_DIM), dtype=tl.float32)
        end = start + tl.minimum(first + BLOCK_Q, length)  # keys past the block's last query never matter
        # split `split` of SPLITS takes its share of the key blocks; the combine kernel merges the shares
        per_split = tl.cdiv(tl.cdiv(end, BLOCK_N), SPLITS) * BLOCK_N
        lo = split * per_split
        hi = tl.minimum(end, lo + per_split)
        if PIPELINED:
            # a for loop over a runtime bound is what the compiler software-pipelines (the next keys load
            # while this block computes), which the while loop below does not
            for key_start in range(lo, hi, BLOCK_N):
                m, total, acc = _key_block(q, k_head, v_head, pages, key_start, end, position, m, total, acc, dims,
                                           stride_ks, stride_kl, stride_vs, stride_vl, BLOCK_N, PAGE, PRECISION, SCALE)
        else:
            key_start = lo
            while key_start < hi:  # Triton's CPU interpreter cannot range over a loaded value
                m, total, acc = _key_block(q, k_head, v_head, pages, key_start, end, position, m, total, acc, dims,
                                           stride_ks, stride_kl, stride_vs, stride_vl, BLOCK_N, PAGE, PRECISION, SCALE)
                key_start += BLOCK_N
        if SPLITS == 1:
            out = acc / total[:, None]
            tl.store(Out + q_rows[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :],
                     out.to(Out.dtype.element_ty), mask=real[:, None])
        else:  # this split's share, unnormalised, for the combine kernel: [block, kv head, split, row]
            part = ((block * tl.num_programs(1) + kv_head) * SPLITS + split) * ROWS + rows
            tl.store(PartM + part, m)
            tl.store(PartTotal + part, total)
            tl.store(PartAcc + part[:, None] * HEAD_DIM + dims[None, :], acc)

    @triton.jit
    def _combine_kernel(
        Out, SeqQ0, SeqLen, BlockSeq, PartAcc, PartM, PartTotal, stride_ot, stride_oh,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, ROWS: tl.constexpr,
        HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr,
    ):
        """The small table's split shares merged into its rows of `Out` (the softmax's log-sum-exp rule)."""
        block = tl.program_id(0)
        kv_head = tl.program_id(1)
        seq = tl.load(BlockSeq + block)
        if seq < 0:
            return
        q0 = tl.load(SeqQ0 + seq)
        length = tl.load(SeqLen + seq)
        rows = tl.arange(0, ROWS)
        token = rows // GROUP_PAD
        heads = kv_head * GROUP + rows % GROUP_PAD
        real = (rows < BLOCK_Q * GROUP_PAD) & (token < length) & (rows % GROUP_PAD < GROUP)
        dims = tl.arange(0, HEAD_DIM)
        base = (block * tl.num_programs(1) + kv_head) * SPLITS * ROWS + rows
        m = tl.full((ROWS,), float("-inf"), dtype=tl.float32)
        for s in tl.static_range(SPLITS):
            m = tl.maximum(m, tl.load(PartM + base + s * ROWS))
        m = tl.where(m == float("-inf"), 0.0, m)  # padding rows: no key at all
        total = tl.zeros((ROWS,), dtype=tl.float32)
        acc = tl.zeros((ROWS, HEAD_DIM), dtype=tl.float32)
        for s in tl.static_range(SPLITS):
            weight = tl.exp2(tl.load(PartM + base + s * ROWS) - m)
            total += weight * tl.load(PartTotal + base + s * ROWS)
            acc += weight[:, None] * tl.load(PartAcc + (base + s * ROWS)[:, None] * HEAD_DIM + dims[None, :])
        out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
        q_rows = (q0 + token).to(tl.int64)
        tl.store(Out + q_rows[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :],
                 out.to(Out.dtype.element_ty), mask=real[:, None])


def packed_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, seq_pages: torch.Tensor,
    seq_start: torch.Tensor, seq_q0: torch.Tensor, seq_len: torch.Tensor, small_seq: torch.Tensor,
    block_seq: torch.Tensor, block_q: torch.Tensor, scale: float, *, block_n: int = 64, splits: int = 1,
) -> torch.Tensor:
    """query [T, Hq, D]; keys/values [pages, Hkv, page_size, D]; per sequence [N]: `seq_pages` [N, pages per slot],
    `start` (keys its slot held before this step), its first token's index and its query length; the tables of
    packed_batch.py's `block_tables`. -> [T, Hq, D] in query's dtype; rows no sequence covers are zeros. `splits`:
    the small table's keys in that many shares, merged by a third launch. No host syncs: a CUDA graph captures it."""
    if triton is None:
        raise RuntimeError("packed attention needs triton (pip install triton), or set kernels: reference")
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = keys.shape[1]
    group = num_heads // num_kv_heads
    assert group * num_kv_heads == num_heads, (num_heads, num_kv_heads)
    assert head_dim == triton.next_power_of_2(head_dim) and head_dim >= 16, head_dim
    assert keys.stride(-1) == 1 and values.stride(-1) == 1 and query.stride(-1) == 1
    page = keys.shape[2]
    assert page % block_n == 0, (page, block_n, "a block of keys would span two pages")
    out = torch.zeros(query.shape, dtype=query.dtype, device=query.device)
    group_pad = triton.next_power_of_2(group)
    strides = (query.stride(0), query.stride(1), keys.stride(0), keys.stride(1), keys.stride(2),
               values.stride(0), values.stride(1), values.stride(2), out.stride(0), out.stride(1), seq_pages.stride(0))
    with launch_guard():
        for table, firsts, tokens, single in ((small_seq, small_seq, SMALL_Q, True), (block_seq, block_q, BLOCK_Q, False)):
            if table.shape[0] == 0:
                continue
            rows = max(tokens * group_pad, MIN_ROWS)
            shares = splits if single else 1
            part_acc = part_m = part_total = out  # unread when a table runs in one share
            if shares > 1:
                part_m = torch.empty((table.shape[0], num_kv_heads, shares, rows), dtype=torch.float32,
                                     device=query.device)
                part_total = torch.empty_like(part_m)
                part_acc = torch.empty((*part_m.shape, head_dim), dtype=torch.float32, device=query.device)
            _packed_kernel[(table.shape[0], num_kv_heads, shares)](
                query, keys, values, out, seq_pages, seq_start, seq_q0, seq_len, table, firsts, part_acc, part_m,
                part_total, *strides,
                PAGE=page, GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=tokens, ROWS=rows, SINGLE=single,
                HEAD_DIM=head_dim, BLOCK_N=block_n, SPLITS=shares,
                # a constant, not an argument: torch.compile would pass a Python float as float64
                PRECISION=dot_precision(query.dtype), SCALE=scale,
                PIPELINED=not interpreted(),
                # big tiles (128 rows of 128) want 8 warps and 3 stages on decode, prefill and mixed steps
                # alike; smaller tiles keep Triton's usual 4 warps, 2 stages
                **({"num_warps": 8, "num_stages": 3} if rows * head_dim >= 128 * 128
                   else {"num_warps": 4, "num_stages": 2}),
            )
            if shares > 1:
                _combine_kernel[(table.shape[0], num_kv_heads)](
                    out, seq_q0, seq_len, table, part_acc, part_m, part_total, out.stride(0), out.stride(1),
                    GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=tokens, ROWS=rows, HEAD_DIM=head_dim, SPLITS=shares,
                )
    return out


# Most decode rows' keys in one share each, unless their programs would leave the GPU half idle: a few rows
# over long contexts gain from splitting, a full GPU's worth of programs only loses by it
MAX_SHARES = 8


def shares_for(rows: int, kv_heads: int, programs: int) -> int:
    """How many shares a small table of `rows` decode rows splits its keys into: the largest power of two (at
    most MAX_SHARES) that keeps its programs within `programs`, the count that fills the GPU (0: never split).
    A loop of comparisons, not a logarithm: under torch.compile `rows` may be symbolic."""
    shares = 1
    while shares < MAX_SHARES and rows * kv_heads * shares * 2 <= programs:
        shares *= 2
    return shares


class KernelAttention:
    """The kernel as a runner's `PackedAttention`, reading the batch's tensors and both block tables, so a graph
    replays it for any step. `programs`: how many programs fill the device (twice its SMs: two resident per SM),
    which decides how far decode rows' keys are split; 0 keeps them whole (the CPU)."""

    block_q = BLOCK_Q

    def __init__(self, *, block_n: int = 64, programs: int = 0) -> None:
        self.block_n = block_n
        self.programs = programs

    @classmethod
    def on(cls, device: str) -> KernelAttention:
        if not device.startswith("cuda"):
            return cls()
        return cls(programs=2 * torch.cuda.get_device_properties(torch.device(device)).multi_processor_count)

    def __call__(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, batch: PackedBatch,
                 scale: float) -> torch.Tensor:
        splits = shares_for(batch.small_seq.shape[0], keys.shape[1], self.programs)
        return packed_attention(query, keys, values, batch.seq_pages, batch.seq_start, batch.seq_q0, batch.seq_len,
                                batch.small_seq, batch.block_seq, batch.block_q, scale, block_n=self.block_n,
                                splits=splits)
