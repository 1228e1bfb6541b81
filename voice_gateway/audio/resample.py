"""Sample-rate conversion with soxr (a real band-limited resampler, not interpolation)."""

from __future__ import annotations

import numpy as np
import soxr


def resample(samples: np.ndarray, from_hz: int, to_hz: int) -> np.ndarray:
    """Mono float32 in, mono float32 out."""
    if from_hz == to_hz:
        return samples.astype(np.float32, copy=False)
    return soxr.resample(samples.astype(np.float32, copy=False), from_hz, to_hz, quality="HQ").astype(np.float32)
