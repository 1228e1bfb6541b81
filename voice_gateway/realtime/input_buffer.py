"""The session's input audio buffer: decoded, at 16 kHz, on one clock shared with the VAD (ms since the first
append), holding the not-yet-committed tail of the stream, so a VAD segment [start_ms, end_ms] maps onto it."""

from __future__ import annotations

import numpy as np

from engine import INPUT_SAMPLE_RATE_HZ
from voice_gateway.audio.g711 import G711_SAMPLE_RATE_HZ, alaw_decode, ulaw_decode
from voice_gateway.audio.resample import Resampler, resample
from voice_gateway.audio.wav import pcm16_to_float
from voice_gateway.realtime.events import AudioFormat

_SAMPLES_PER_MS = INPUT_SAMPLE_RATE_HZ // 1000


class BufferFull(Exception):
    pass


class InputAudioBuffer:
    """Owns the uncommitted samples and the stream resampler that feeds them."""

    def __init__(self, max_seconds: float) -> None:
        self.max_samples = int(max_seconds * INPUT_SAMPLE_RATE_HZ)
        self._chunks: list[np.ndarray] = []
        self._size = 0
        self.start_sample = 0  # clock position of the buffer's first sample
        self._resampler: Resampler | None = None

    @property
    def end_ms(self) -> int:
        return (self.start_sample + self._size) // _SAMPLES_PER_MS

    @property
    def duration_ms(self) -> int:
        return self._size // _SAMPLES_PER_MS

    def decode(self, data: bytes, fmt: AudioFormat) -> np.ndarray:
        """One append's audio at 16 kHz float32 (ValueError if malformed), seamless across appends."""
        samples, rate_hz = _decode(data, fmt)
        if self._resampler is None or self._resampler.from_hz != rate_hz:
            self._resampler = Resampler(rate_hz, INPUT_SAMPLE_RATE_HZ)
        return self._resampler.process(samples)

    def append(self, samples_16k: np.ndarray) -> None:
        if self._size + samples_16k.size > self.max_samples:
            raise BufferFull(f"the input audio buffer holds at most {self.max_samples // INPUT_SAMPLE_RATE_HZ} s")
        self._chunks.append(samples_16k)
        self._size += samples_16k.size

    def _all(self) -> np.ndarray:
        if len(self._chunks) != 1:
            self._chunks = [np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.float32)]
        return self._chunks[0]

    def _span(self, start_ms: int, end_ms: int) -> tuple[np.ndarray, int, int]:
        data = self._all()
        end = min(data.size, max(0, end_ms * _SAMPLES_PER_MS - self.start_sample))
        start = min(end, max(0, start_ms * _SAMPLES_PER_MS - self.start_sample))
        return data, start, end

    def peek(self, start_ms: int, end_ms: int) -> np.ndarray:
        """A copy of what `take_until(end_ms, start_ms)` would take now; nothing leaves."""
        data, start, end = self._span(start_ms, end_ms)
        return data[start:end].copy()

    def take_until(self, end_ms: int, start_ms: int = 0) -> np.ndarray:
        """Samples from `start_ms` to `end_ms` (clock ms); everything before `end_ms` leaves the buffer."""
        data, start, end = self._span(start_ms, end_ms)
        taken = data[start:end].copy()
        self._chunks = [data[end:]]
        self._size = data.size - end
        self.start_sample += end
        return taken

    def take_all(self) -> np.ndarray:
        return self.take_until(self.end_ms + 1)

    def clear(self) -> None:
        self.take_all()


def decode_clip(data: bytes, fmt: AudioFormat) -> np.ndarray:
    """A whole clip at 16 kHz float32, resampled on its own (not by the append stream's); ValueError if malformed."""
    samples, rate_hz = _decode(data, fmt)
    return resample(samples, rate_hz, INPUT_SAMPLE_RATE_HZ)


def _decode(data: bytes, fmt: AudioFormat) -> tuple[np.ndarray, int]:
    """Client audio in `fmt` (PCM16 at 24 kHz, or G.711 at 8 kHz) as float32 at its own rate."""
    if fmt is AudioFormat.PCM16:
        return pcm16_to_float(data), 24_000
    decode = ulaw_decode if fmt is AudioFormat.G711_ULAW else alaw_decode
    return decode(data), G711_SAMPLE_RATE_HZ
