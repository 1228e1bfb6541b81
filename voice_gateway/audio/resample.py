"""Sample-rate conversion with soxr (a real band-limited resampler, not interpolation)."""

from __future__ import annotations

import numpy as np
import soxr


def resample(samples: np.ndarray, from_hz: int, to_hz: int) -> np.ndarray:
    """Mono float32 in, mono float32 out."""
    if from_hz == to_hz:
        return samples.astype(np.float32, copy=False)
    return soxr.resample(samples.astype(np.float32, copy=False), from_hz, to_hz, quality="HQ").astype(np.float32)


class StreamResampler:
    """Mono float32 in pieces, the same audio out at `to_hz`: memory in proportion to the output."""

    def __init__(self, from_hz: int, to_hz: int) -> None:
        self._stream = None if from_hz == to_hz else soxr.ResampleStream(from_hz, to_hz, 1, dtype="float32",
                                                                          quality="HQ")
        self._out: list[np.ndarray] = []

    def push(self, samples: np.ndarray) -> None:
        samples = samples.astype(np.float32, copy=False)
        self._out.append(samples.copy() if self._stream is None else self._stream.resample_chunk(samples))

    def finish(self) -> np.ndarray:
        if self._stream is not None:
            self._out.append(self._stream.resample_chunk(np.zeros(0, np.float32), last=True))
        return np.concatenate(self._out) if self._out else np.zeros(0, np.float32)
