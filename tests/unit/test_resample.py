"""The one resampling path: a stream in pieces equals the whole stream, and a reset starts afresh."""

from __future__ import annotations

import numpy as np
import pytest

from voice_gateway.audio.resample import Resampler, StreamResampler


@pytest.mark.parametrize(("from_hz", "to_hz"), [(24_000, 48_000), (24_000, 8_000), (48_000, 16_000)])
@pytest.mark.parametrize("piece", [1, 160, 997])
def test_pieces_then_flush_equal_one_stream(from_hz: int, to_hz: int, piece: int) -> None:
    x = np.random.default_rng(0).standard_normal(4_000).astype(np.float32)
    whole = Resampler(from_hz, to_hz)
    expected = np.concatenate([whole.process(x), whole.flush()])
    pieces = Resampler(from_hz, to_hz)
    out = np.concatenate([pieces.process(x[i : i + piece]) for i in range(0, x.size, piece)] + [pieces.flush()])
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, atol=1e-6)
    assert abs(out.size - x.size * to_hz / from_hz) <= 1


def test_reset_and_flush_start_a_new_stream() -> None:
    x = np.random.default_rng(1).standard_normal(2_400).astype(np.float32)
    fresh = Resampler(24_000, 48_000)
    expected = np.concatenate([fresh.process(x), fresh.flush()])
    used = Resampler(24_000, 48_000)
    used.process(x[:700])
    used.reset()  # a cancelled stream's held-back samples never come out
    np.testing.assert_array_equal(np.concatenate([used.process(x), used.flush()]), expected)
    np.testing.assert_array_equal(np.concatenate([used.process(x), used.flush()]), expected)


def test_equal_rates_pass_through() -> None:
    x = np.arange(10, dtype=np.float32)
    same = Resampler(16_000, 16_000)
    assert same.process(x) is x and same.flush().size == 0


def test_a_collected_stream_is_the_whole_clip() -> None:
    x = np.random.default_rng(2).standard_normal(3_000).astype(np.float32)
    collected = StreamResampler(24_000, 16_000)
    for i in range(0, x.size, 512):
        collected.push(x[i : i + 512])
    one = Resampler(24_000, 16_000)
    np.testing.assert_allclose(collected.finish(), np.concatenate([one.process(x), one.flush()]), atol=1e-6)
