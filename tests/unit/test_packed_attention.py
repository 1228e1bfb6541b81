"""The packed (varlen) attention kernel against its torch reference and a per-token float32 ground truth.

On a CPU the kernel runs in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1), so the
shapes stay small; on a GPU it runs compiled, in bf16 as deployed.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from engine.accel import packed_attention  # noqa: E402
from engine.accel.packed_attention import BLOCK_Q, query_blocks  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
TOLERANCE = 2e-2 if DTYPE == torch.bfloat16 else 1e-5
MAX_LEN = 96


@dataclass(frozen=True)
class Step:
    """One packed step: per sequence its slot, the keys its slot held before and its query length."""

    slots: list[int]
    starts: list[int]
    lengths: list[int]
    padding: int = 0  # query rows after the last sequence (a graph's fixed token count)
    index_dtype: torch.dtype = torch.int32

    @property
    def q0s(self) -> list[int]:
        return [sum(self.lengths[:n]) for n in range(len(self.lengths))]

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths) + self.padding


STEPS = {
    # one query per row; starts around a key block's edges; slots out of order
    "decode": Step(slots=[5, 0, 3, 2], starts=[0, 15, 16, 70], lengths=[1, 1, 1, 1], padding=2),
    "long_piece": Step(slots=[1], starts=[0], lengths=[75], padding=5, index_dtype=torch.int64),
    # decode rows between pieces that continue a prompt (start > 0), an empty sequence among them
    "mixed": Step(slots=[4, 6, 0, 2, 5, 1], starts=[40, 7, 0, 12, 50, 33], lengths=[1, 17, 1, 0, 33, 1], padding=3),
    "off_blocks": Step(slots=[3, 1, 4, 0, 2], starts=[9, 0, 30, 64, 2], lengths=[1, 15, 16, 17, 0],
                       index_dtype=torch.int64),
}


def ground_truth(query, keys, values, step: Step, scale: float) -> torch.Tensor:
    """Each query token of each head on its own: a softmax over keys 0..its position, in float32."""
    out = torch.zeros(query.shape, dtype=torch.float32)
    group = query.shape[1] // keys.shape[1]
    for slot, start, q0, length in zip(step.slots, step.starts, step.q0s, step.lengths, strict=True):
        for i in range(length):
            for head in range(query.shape[1]):
                k = keys[slot, head // group, :start + i + 1].float().cpu()
                v = values[slot, head // group, :start + i + 1].float().cpu()
                weights = torch.softmax(k @ query[q0 + i, head].float().cpu() * scale, dim=0)
                out[q0 + i, head] = weights @ v
    return out


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all()
    return float((out.float().cpu() - ref.float().cpu()).norm() / ref.float().cpu().norm())


def run_kernel(query, keys, values, step: Step, scale: float, block_n: int, num_blocks: int | None = None):
    block_seq, block_q = query_blocks(step.lengths, num_blocks)
    ints = {"device": DEVICE, "dtype": step.index_dtype}
    return packed_attention.packed_attention(
        query, keys, values, torch.tensor(step.slots, **ints), torch.tensor(step.starts, **ints),
        torch.tensor(step.q0s, **ints), torch.tensor(step.lengths, **ints), torch.tensor(block_seq, **ints),
        torch.tensor(block_q, **ints), scale, block_n=block_n,
    )


@pytest.mark.parametrize("name", list(STEPS))
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(8, 2), (4, 4), (32, 4), (4, 2)])
@pytest.mark.parametrize(("head_dim", "block_n"), [(16, 64), (32, 16)])  # one key block, and several
def test_packed_attention_matches_reference_and_ground_truth(
    name: str, num_heads: int, num_kv_heads: int, head_dim: int, block_n: int,
) -> None:
    step = STEPS[name]
    gen = torch.Generator().manual_seed(num_heads * head_dim + block_n)
    num_slots = max(step.slots) + 2  # and the scratch slot
    keys = torch.randn(num_slots, num_kv_heads, MAX_LEN, head_dim, generator=gen).to(DEVICE, DTYPE)
    values = torch.randn(num_slots, num_kv_heads, MAX_LEN, head_dim, generator=gen).to(DEVICE, DTYPE)
    query = torch.randn(step.num_tokens, num_heads, head_dim, generator=gen).to(DEVICE, DTYPE)
    scale = head_dim**-0.5

    out = run_kernel(query, keys, values, step, scale, block_n)
    ref = packed_attention.packed_attention_reference(
        query, keys, values, step.slots, step.starts, step.q0s, step.lengths, scale)
    truth = ground_truth(query, keys, values, step, scale)
    assert out.shape == query.shape and out.dtype == query.dtype
    assert ref.shape == query.shape and ref.dtype == query.dtype
    assert relative_error(ref, truth) < TOLERANCE
    assert relative_error(out, truth) < TOLERANCE
    # rows no sequence covers come back zero
    covered = sum(step.lengths)
    assert not out[covered:].any() and not ref[covered:].any()

    # keys past a sequence's last query must not matter
    for slot, start, length in zip(step.slots, step.starts, step.lengths, strict=True):
        keys[slot, :, start + length:] = 1e4
        values[slot, :, start + length:] = 1e4
    assert torch.equal(run_kernel(query, keys, values, step, scale, block_n), out)
    # nor do padding blocks of a graph's fixed grid; a head-major query (a transposed view) reads the same
    needed = len(query_blocks(step.lengths)[0])
    strided = query.transpose(0, 1).contiguous().transpose(0, 1)
    assert torch.equal(run_kernel(strided, keys, values, step, scale, block_n, num_blocks=needed + 3), out)


def test_kernel_attention_reads_a_batchs_tensors() -> None:
    """What a runner hands over: one int64 tensor of metadata, split into views (PackedBatch's layout)."""
    step = STEPS["mixed"]
    gen = torch.Generator().manual_seed(3)
    keys = torch.randn(8, 2, MAX_LEN, 16, generator=gen).to(DEVICE, DTYPE)
    values = torch.randn(8, 2, MAX_LEN, 16, generator=gen).to(DEVICE, DTYPE)
    query = torch.randn(step.num_tokens, 8, 16, generator=gen).to(DEVICE, DTYPE)
    block_seq, block_q = query_blocks(step.lengths, num_blocks=8)
    parts = [step.slots, step.starts, step.q0s, step.lengths, block_seq, block_q]
    meta = torch.tensor([x for part in parts for x in part], device=DEVICE)
    views = meta.split([len(part) for part in parts])
    batch = SimpleNamespace(**dict(zip(["seq_slot", "seq_start", "seq_q0", "seq_len", "block_seq", "block_q"],
                                       views, strict=True)))
    attention = packed_attention.KernelAttention(block_n=32)
    assert attention.block_q == BLOCK_Q
    out = attention(query, keys, values, batch, 0.25)  # type: ignore[arg-type]
    assert torch.equal(out, run_kernel(query, keys, values, step, 0.25, 32))


def test_query_blocks_split_each_sequence_into_blocks_of_block_q() -> None:
    assert BLOCK_Q == 16
    assert query_blocks([1, 0, 33, 16]) == ([0, 2, 2, 2, 3], [0, 0, 16, 32, 0])
    assert query_blocks([17, 1], num_blocks=5) == ([0, 0, 1, -1, -1], [0, 16, 0, 0, 0])
    assert query_blocks([16], num_blocks=1) == ([0], [0])
    assert query_blocks([0, 0], num_blocks=2) == ([-1, -1], [0, 0])
    assert query_blocks([]) == ([], [])
    with pytest.raises(AssertionError, match="do not fit"):
        query_blocks([17, 1], num_blocks=2)
