"""Sample-rate conversion, the one path every resampling in the gateway takes: soxr (band-limited) at HQ quality.
`resample`: one whole clip; `Resampler`: one stream in pieces, seamless across them, its filter's delay held back
until `flush`; `StreamResampler`: a stream in pieces collected into one clip."""

from __future__ import annotations

import numpy as np
import soxr

_QUALITY = "HQ"


def resample(samples: np.ndarray, from_hz: int, to_hz: int) -> np.ndarray:
    if from_hz == to_hz:
        return samples.astype(np.float32, copy=False)
    return soxr.resample(samples.astype(np.float32, copy=False), from_hz, to_hz, quality=_QUALITY).astype(np.float32)


class Resampler:
    """Owns one stream's filter state: mono float32 pieces in, the same audio out at `to_hz`. The output of the pieces,
    then of `flush()` (the filter's delay), is the whole stream resampled; `reset()` forgets the stream. Equal rates
    pass through."""

    def __init__(self, from_hz: int, to_hz: int) -> None:
        self.from_hz = from_hz
        self.to_hz = to_hz
        self._stream = None if from_hz == to_hz else soxr.ResampleStream(from_hz, to_hz, 1, dtype="float32",
                                                                          quality=_QUALITY)

    def process(self, samples: np.ndarray) -> np.ndarray:
        samples = samples.astype(np.float32, copy=False)
        return samples if self._stream is None else self._stream.resample_chunk(samples)

    def flush(self) -> np.ndarray:
        """The end of the stream: what the filter still holds; the next piece starts a new stream."""
        if self._stream is None:
            return np.zeros(0, np.float32)
        tail = self._stream.resample_chunk(np.zeros(0, np.float32), last=True)
        self._stream.clear()
        return tail

    def reset(self) -> None:
        """Drop the stream in progress (a cancelled reply): its held-back samples never come out."""
        if self._stream is not None:
            self._stream.clear()


class StreamResampler:
    """Mono float32 in pieces, the same audio out at `to_hz` as one clip: memory in proportion to the output."""

    def __init__(self, from_hz: int, to_hz: int) -> None:
        self._resampler = Resampler(from_hz, to_hz)
        self._out: list[np.ndarray] = []

    def push(self, samples: np.ndarray) -> None:
        out = self._resampler.process(samples)
        self._out.append(out.copy() if out is samples else out)

    def finish(self) -> np.ndarray:
        self._out.append(self._resampler.flush())
        return np.concatenate(self._out)
