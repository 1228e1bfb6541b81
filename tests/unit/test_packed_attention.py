"""The packed (varlen) attention kernel against its torch reference (packed_batch.py's `ReferenceAttention`) and
a per-token float32 ground truth, with decode rows in the small block table and longer pieces in the big one.

On a CPU the kernel runs in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1), so the
shapes stay small; on a GPU it runs compiled, in bf16 as deployed.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from engine.omni.accel import packed_attention  # noqa: E402
from engine.omni.accel.packed_attention import BLOCK_Q  # noqa: E402
from engine.omni.runners.kv_cache import SlotKVCache  # noqa: E402
from engine.omni.runners.packed_batch import (  # noqa: E402
    SMALL_Q,
    PackedBatch,
    Piece,
    ReferenceAttention,
    block_tables,
    num_blocks,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
TOLERANCE = 2e-2 if DTYPE == torch.bfloat16 else 1e-5
MAX_LEN = 96
PAGE = 64  # two pages a slot: blocks of keys on both sides of a page's edge


@dataclass(frozen=True)
class Step:
    """One packed step: per sequence its slot, the keys its slot held before and its query length."""

    slots: list[int]
    starts: list[int]
    lengths: list[int]
    padding: int = 0  # query rows after the last sequence (a graph's fixed token count)
    spare_seqs: int = 0  # sequences a graph's batch holds beyond these: -1 entries in both block tables
    index_dtype: torch.dtype = torch.int32

    @property
    def q0s(self) -> list[int]:
        return [sum(self.lengths[:n]) for n in range(len(self.lengths))]

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths) + self.padding

    @property
    def pieces(self) -> list[Piece]:
        return [Piece(slot, start, length) for slot, start, length in zip(self.slots, self.starts, self.lengths,
                                                                           strict=True)]


STEPS = {
    # one query per row; starts around a key block's edges; slots out of order
    "decode": Step(slots=[5, 0, 3, 2], starts=[0, 15, 16, 70], lengths=[1, 1, 1, 1], padding=2),
    "long_piece": Step(slots=[1], starts=[0], lengths=[75], padding=5, index_dtype=torch.int64),
    # decode rows between pieces that continue a prompt (start > 0), an empty sequence among them
    "mixed": Step(slots=[4, 6, 0, 2, 5, 1], starts=[40, 7, 0, 12, 50, 33], lengths=[1, 17, 1, 0, 33, 1], padding=3),
    "off_blocks": Step(slots=[3, 1, 4, 0, 2], starts=[9, 0, 30, 64, 2], lengths=[1, 15, 16, 17, 0],
                       index_dtype=torch.int64),
    # both tables in use, each with padding entries: lengths around SMALL_Q and around BLOCK_Q
    "both_tables": Step(slots=[2, 5, 0, 3, 1, 4], starts=[10, 0, 31, 5, 60, 0], lengths=[2, 1, 3, 16, 17, 2],
                        padding=4, spare_seqs=2),
}


def paged_cache(num_slots: int, num_kv_heads: int, head_dim: int, gen: torch.Generator) -> SlotKVCache:
    """A cache whose slots hold their pages out of order (page k of a slot is not next to page k - 1), every
    position random."""
    cache = SlotKVCache(num_layers=1, num_slots=num_slots, num_kv_heads=num_kv_heads, head_dim=head_dim,
                        max_len=MAX_LEN, dtype=DTYPE, device=DEVICE, page_size=PAGE)
    order = torch.randperm(len(cache.free_pages), generator=gen).tolist()
    cache.free_pages = [cache.free_pages[i] for i in order]
    for slot in range(num_slots):
        assert cache.reserve(slot, MAX_LEN)
    cache.keys[0].copy_(torch.randn(cache.keys[0].shape, generator=gen))
    cache.values[0].copy_(torch.randn(cache.values[0].shape, generator=gen))
    return cache


def ground_truth(query, cache: SlotKVCache, step: Step, scale: float) -> torch.Tensor:
    """Each query token of each head on its own: a softmax over keys 0..its position, in float32."""
    out = torch.zeros(query.shape, dtype=torch.float32)
    group = query.shape[1] // cache.keys[0].shape[1]
    for slot, start, q0, length in zip(step.slots, step.starts, step.q0s, step.lengths, strict=True):
        keys, values = cache.read(slot, MAX_LEN, 0)
        for i in range(length):
            for head in range(query.shape[1]):
                k = keys[head // group, :start + i + 1].float().cpu()
                v = values[head // group, :start + i + 1].float().cpu()
                weights = torch.softmax(k @ query[q0 + i, head].float().cpu() * scale, dim=0)
                out[q0 + i, head] = weights @ v
    return out


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all()
    return float((out.float().cpu() - ref.float().cpu()).norm() / ref.float().cpu().norm())


def run_kernel(query, cache: SlotKVCache, step: Step, scale: float, block_n: int, spare_seqs: int = 0,
               splits: int = 1):
    """The kernel over the step's tables, sized for a batch of the step's tokens and `spare_seqs` more
    sequences (each table gets that many more -1 entries); the small table's keys in `splits` shares."""
    seqs = len(step.lengths) + step.spare_seqs + spare_seqs
    small_seq, block_seq, block_q = block_tables(step.lengths, BLOCK_Q, step.num_tokens, seqs)
    ints = {"device": DEVICE, "dtype": step.index_dtype}
    pages = torch.tensor(cache.page_table(step.slots, pad_to=seqs), **ints)
    return packed_attention.packed_attention(
        query, cache.keys[0], cache.values[0], pages, torch.tensor(step.starts, **ints),
        torch.tensor(step.q0s, **ints), torch.tensor(step.lengths, **ints), torch.tensor(small_seq, **ints),
        torch.tensor(block_seq, **ints), torch.tensor(block_q, **ints), scale, block_n=block_n, splits=splits,
    )


def reference(query, cache: SlotKVCache, step: Step, scale: float) -> torch.Tensor:
    batch = SimpleNamespace(pieces=step.pieces, cache=cache)
    return ReferenceAttention()(query, cache.keys[0], cache.values[0], batch, scale)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", list(STEPS))
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(8, 2), (4, 4), (32, 4), (4, 2)])
@pytest.mark.parametrize(("head_dim", "block_n"), [(16, 64), (32, 16)])  # one key block, and several
def test_packed_attention_matches_reference_and_ground_truth(
    name: str, num_heads: int, num_kv_heads: int, head_dim: int, block_n: int,
) -> None:
    step = STEPS[name]
    gen = torch.Generator().manual_seed(num_heads * head_dim + block_n)
    cache = paged_cache(max(step.slots) + 1, num_kv_heads, head_dim, gen)
    query = torch.randn(step.num_tokens, num_heads, head_dim, generator=gen).to(DEVICE, DTYPE)
    scale = head_dim**-0.5

    out = run_kernel(query, cache, step, scale, block_n)
    ref = reference(query, cache, step, scale)
    truth = ground_truth(query, cache, step, scale)
    assert out.shape == query.shape and out.dtype == query.dtype
    assert ref.shape == query.shape and ref.dtype == query.dtype
    assert relative_error(ref, truth) < TOLERANCE
    assert relative_error(out, truth) < TOLERANCE
    # rows no sequence covers come back zero
    covered = sum(step.lengths)
    assert not out[covered:].any() and not ref[covered:].any()

    # keys past a sequence's last query must not matter
    for slot, start, length in zip(step.slots, step.starts, step.lengths, strict=True):
        positions = torch.arange(start + length, MAX_LEN)
        pages = torch.from_numpy(cache.locate(np.full(len(positions), slot), positions.numpy()))
        offsets = positions % PAGE
        cache.keys[0][pages, :, offsets] = 1e4
        cache.values[0][pages, :, offsets] = 1e4
    assert torch.equal(run_kernel(query, cache, step, scale, block_n), out)
    # nor do more padding entries of a graph's fixed grids; a head-major query (a transposed view) reads the same
    strided = query.transpose(0, 1).contiguous().transpose(0, 1)
    assert torch.equal(run_kernel(strided, cache, step, scale, block_n, spare_seqs=3), out)


def test_kernel_attention_reads_a_batchs_tensors() -> None:
    """What a runner hands over: a PackedBatch, its one int64 tensor of metadata split into views, padded to a
    graph's tokens and sequences; the kernel through it equals the reference through the same batch."""
    step = STEPS["both_tables"]
    gen = torch.Generator().manual_seed(3)
    cache = paged_cache(8, 2, 16, gen)
    keys, values = cache.keys[0], cache.values[0]
    query = torch.randn(step.num_tokens, 8, 16, generator=gen).to(DEVICE, DTYPE)
    attention = packed_attention.KernelAttention(block_n=32)
    assert attention.block_q == BLOCK_Q
    batch = PackedBatch.static(cache, attention, step.num_tokens, cache.num_slots)
    batch.meta.copy_(torch.from_numpy(batch.layout(step.pieces)))
    assert batch.small_seq.tolist() == [0, 1, 5, -1, -1, -1, -1, -1]  # lengths 2, 1 and 2: up to SMALL_Q
    assert batch.block_seq.tolist()[:5] == [2, 3, 4, 4, -1] and batch.block_q.tolist()[:4] == [0, 0, 0, 16]
    out = attention(query, keys, values, batch, 0.25)
    assert torch.equal(out, run_kernel(query, cache, step, 0.25, 32))
    eager = PackedBatch.of(cache, ReferenceAttention(), step.pieces)
    assert eager.meta.numel() == PackedBatch.meta_size(step.num_tokens - step.padding, len(step.pieces), 0,
                                                       cache.pages_per_slot)
    assert relative_error(out, ReferenceAttention()(query, keys, values, eager, 0.25)) < TOLERANCE


@pytest.mark.parametrize("lengths", [[1], [3, 1], [5, 1, 2], [7, 1, 1, 17]])
def test_every_view_of_a_batch_starts_on_16_bytes(lengths: list[int]) -> None:
    """Triton compiles a kernel again for a pointer off 16 bytes: an eager step's views of its metadata (any
    number of tokens and sequences, odd ones too) all start on 16 bytes, as a graph's do."""
    cache = paged_cache(8, 2, 16, torch.Generator().manual_seed(0))
    pieces = [Piece(slot, 0, n) for slot, n in enumerate(lengths)]
    attention = packed_attention.KernelAttention(block_n=32)
    eager = PackedBatch.of(cache, attention, pieces)
    for batch in (eager, PackedBatch.static(cache, attention, sum(lengths) + 1, 5)):
        views = [batch.token_page, batch.token_offset, batch.token_pos, batch.seq_start, batch.seq_q0, batch.seq_len,
                 batch.last, batch.small_seq, batch.block_seq, batch.block_q, batch.rope, batch.seq_pages]
        assert [v.data_ptr() % 16 for v in views] == [0] * len(views)
        assert batch.meta.numel() == PackedBatch.meta_size(batch.tokens, batch.seqs, BLOCK_Q, cache.pages_per_slot)
    # the padding between the parts moves nothing: each view holds its own values
    assert eager.seq_len.tolist() == lengths and eager.last.tolist() == (np.cumsum(lengths) - 1).tolist()
    assert eager.token_pos.tolist() == [i for n in lengths for i in range(n)]
    assert eager.seq_pages.tolist() == cache.page_table(list(range(len(lengths)))).tolist()


def test_block_tables_put_short_sequences_in_the_small_table() -> None:
    assert BLOCK_Q == 16 and SMALL_Q == 2
    assert SMALL_Q * 8 >= 16  # a decode pair fills the smallest tile with the Thinker's 8 heads per group
    # one entry per sequence of 1..SMALL_Q tokens; BLOCK_Q blocks of the longer ones; empty ones in neither
    small, big_seq, big_first = block_tables([1, 0, 33, 16, 2, 3], BLOCK_Q, tokens=55, seqs=7)
    assert small == [0, 4, -1, -1, -1, -1, -1]
    assert len(big_seq) == len(big_first) == num_blocks(55, 7, BLOCK_Q) == 11
    assert big_seq[:5] == [2, 2, 2, 3, 5] and big_first[:5] == [0, 16, 32, 0, 0]
    assert big_seq[5:] == [-1] * 6 and big_first[5:] == [0] * 6
    assert block_tables([], BLOCK_Q, tokens=0, seqs=0) == ([], [], [])
    assert block_tables([1, 1], BLOCK_Q, tokens=2, seqs=2) == ([0, 1], [-1] * 3, [0] * 3)
    with pytest.raises(AssertionError):
        block_tables([1, 1, 1], BLOCK_Q, tokens=3, seqs=2)


@pytest.mark.parametrize("name", ["decode", "mixed", "both_tables"])
@pytest.mark.parametrize("splits", [2, 3, 8])  # 8: more shares than a short row has key blocks (empty ones)
def test_decode_rows_split_over_their_keys_equal_one_share(name: str, splits: int) -> None:
    """The small table's keys in shares, each its own program, merged after: the same rows as one share (to
    float rounding: another summation order), the big table's rows untouched, and the ground truth."""
    step = STEPS[name]
    gen = torch.Generator().manual_seed(splits)
    cache = paged_cache(max(step.slots) + 1, 4, 32, gen)
    query = torch.randn(step.num_tokens, 32, 32, generator=gen).to(DEVICE, DTYPE)
    scale = 32**-0.5
    whole = run_kernel(query, cache, step, scale, 16)
    split = run_kernel(query, cache, step, scale, 16, spare_seqs=2, splits=splits)
    torch.testing.assert_close(split, whole, rtol=TOLERANCE, atol=TOLERANCE)
    assert relative_error(split, ground_truth(query, cache, step, scale)) < TOLERANCE
    big = [q0 + i for q0, length in zip(step.q0s, step.lengths, strict=True) if length > SMALL_Q for i in range(length)]
    assert torch.equal(split[big], whole[big])
    assert not split[sum(step.lengths):].any()


def test_decode_rows_split_only_while_their_programs_leave_the_gpu_idle() -> None:
    """Shares double while the small table's programs stay within what fills the device, up to MAX_SHARES;
    a device of 0 programs (the CPU) never splits."""
    programs = 2 * 132  # an H100's SMs, two programs each
    assert [packed_attention.shares_for(rows, 4, programs) for rows in (1, 8, 16, 32, 64, 128)] == [8, 8, 4, 2, 1, 1]
    assert packed_attention.shares_for(1, 4, 0) == 1
    assert packed_attention.KernelAttention.on("cpu").programs == 0
