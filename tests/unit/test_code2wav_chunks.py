"""Chunked Code2Wav (with left context, padded batches) equals one decode of the same frames."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from code2wav_windows import Code2WavRunner

from engine.omni.weights.checkpoint import load_stage


@pytest.fixture(scope="module")
def runner(tiny_checkpoint: Path) -> Code2WavRunner:
    model = load_stage(tiny_checkpoint, "code2wav", device="cpu", dtype="float32").model
    with torch.inference_mode():
        return Code2WavRunner(model)


def _codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (16, frames), generator=torch.Generator().manual_seed(seed))


def _bounds(total: int, first: int, size: int) -> list[tuple[int, int]]:
    ends = [min(first, total)]
    while ends[-1] < total:
        ends.append(min(total, ends[-1] + size))
    return list(zip([0, *ends[:-1]], ends, strict=True))


def test_every_call_drops_the_same_causal_tail(runner: Code2WavRunner) -> None:
    assert runner.samples_per_frame == 1920
    assert runner.tail_samples == 555
    with torch.inference_mode():
        for frames in (1, 2, 7):
            out = runner.decode(_codes(frames, frames)[None])
            assert out.shape[-1] == frames * 1920 - 555


@pytest.mark.parametrize(("first", "size"), [(1, 1), (2, 8), (4, 25), (3, 5)])
def test_chunks_join_into_the_one_shot_decode(runner: Code2WavRunner, first: int, size: int) -> None:
    codes = _codes(37, seed=first * 100 + size)
    with torch.inference_mode():
        whole = runner.decode(codes[None])[0]
        pieces = [runner.decode_windows([codes], [runner.window(s, e, 8)])[0] for s, e in _bounds(37, first, size)]
    joined = torch.cat(pieces)
    assert joined.shape == whole.shape
    assert (joined - whole).abs().max().item() <= 1e-4 * whole.abs().max().item()


def test_too_little_left_context_is_detectably_wrong(runner: Code2WavRunner) -> None:
    """Guards the test above: it would notice a seam."""
    codes = _codes(20, seed=5)
    with torch.inference_mode():
        whole = runner.decode(codes[None])[0]
        joined = torch.cat([runner.decode_windows([codes], [runner.window(s, e, 1)])[0] for s, e in _bounds(20, 4, 4)])
    assert (joined - whole).abs().max().item() > 1e-2


def test_a_padded_batch_equals_each_row_alone(runner: Code2WavRunner) -> None:
    rows = [_codes(n, seed=n) for n in (5, 12, 30)]
    windows = [runner.window(0, 5, 8), runner.window(4, 12, 8), runner.window(20, 30, 8)]
    with torch.inference_mode():
        batched = runner.decode_windows(rows, windows)
        alone = [runner.decode_windows([r], [w])[0] for r, w in zip(rows, windows, strict=True)]
    for b, a in zip(batched, alone, strict=True):
        assert b.shape == a.shape
        assert (b - a).abs().max().item() <= 1e-5
