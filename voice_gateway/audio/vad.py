"""Server voice-activity detection (the Realtime API's `server_vad`): the turn state of one input stream, on webrtcvad."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import webrtcvad

from voice_gateway.audio.wav import float_to_pcm16

# webrtcvad takes 10, 20 or 30 ms frames; its hangover is about the same in ms at every size, so the smallest frame
# gives the finest event times.
_FRAME_MS = 10
# webrtcvad pads every voiced burst with 60-80 ms of hangover, so a 10 ms click reads as a 70-100 ms voiced run,
# and a fresh Vad calls its first 70-90 ms voiced while its noise model settles. A run must outlast both to be
# speech; a short "yes" (~300 ms) still is.
_MIN_SPEECH_MS = 150
_SAMPLE_RATES_HZ = (8_000, 16_000, 32_000, 48_000)


@dataclass(frozen=True, slots=True)
class VadConfig:
    """`turn_detection: {"type": "server_vad", ...}` settings."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold: must be in [0, 1], got {self.threshold}")
        if self.prefix_padding_ms < 0:
            raise ValueError(f"prefix_padding_ms: must be >= 0, got {self.prefix_padding_ms}")
        if self.silence_duration_ms < 0:
            raise ValueError(f"silence_duration_ms: must be >= 0, got {self.silence_duration_ms}")

    @property
    def aggressiveness(self) -> int:
        """webrtcvad mode: threshold [0, 0.25) -> 0, [0.25, 0.5) -> 1, [0.5, 0.75) -> 2, [0.75, 1] -> 3. Both scales
        mean "how sure before calling it speech": a higher one rejects more noise and misses more quiet speech."""
        return min(3, int(self.threshold * 4))


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    audio_start_ms: int


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    audio_end_ms: int


class ServerVad:
    """Owns one input stream's webrtcvad instance, partial-frame buffer, sample clock and speech/silence state. Speech
    starts once `_MIN_SPEECH_MS` of consecutive 10 ms frames are voiced (`audio_start_ms`: the first one's start) and
    stops once `config.silence_duration_ms` have passed since the last voiced frame's end (`audio_end_ms`).
    webrtcvad's hangover counts as voiced, making `audio_end_ms` late after a loud ending; it also keeps a quiet final
    consonant that webrtcvad calls unvoiced, so we keep it. Times are ms from the first sample ever fed; the caller
    slices its own buffer and applies `config.prefix_padding_ms`."""

    def __init__(self, config: VadConfig, sample_rate_hz: int = 16_000) -> None:
        if sample_rate_hz not in _SAMPLE_RATES_HZ:
            raise ValueError(f"sample_rate_hz: webrtcvad takes {_SAMPLE_RATES_HZ}, got {sample_rate_hz}")
        self.config = config
        self.sample_rate_hz = sample_rate_hz
        self._frame_samples = sample_rate_hz * _FRAME_MS // 1000
        self._samples_fed = 0
        self.reset()

    def reset(self) -> None:
        """Forget buffered audio, the noise model and any speech in progress; the clock keeps running."""
        self._vad = webrtcvad.Vad(self.config.aggressiveness)
        self._pending = bytearray()  # PCM16 of a partial frame
        self._frame_start_sample = self._samples_fed
        self._run_start_ms: int | None = None  # first frame of the current voiced run
        self._last_voiced_end_ms = 0
        self._in_speech = False

    @property
    def total_ms(self) -> int:
        return self._samples_fed * 1000 // self.sample_rate_hz

    @property
    def in_speech(self) -> bool:
        return self._in_speech

    @property
    def silent_since_ms(self) -> int | None:
        """In speech, in a silence: where it began (the last voiced frame's end); else None."""
        return self._last_voiced_end_ms if self._in_speech and self._run_start_ms is None else None

    @property
    def voiced_run_start_ms(self) -> int | None:
        """Where the voiced run now being fed began (None in silence): speech not yet long enough to be called so."""
        return self._run_start_ms

    def feed(self, samples: np.ndarray) -> list[SpeechStarted | SpeechStopped]:
        """Float32 mono at `sample_rate_hz`, any length; returns the events its complete frames produced, in order."""
        if samples.ndim != 1:
            raise ValueError(f"expected mono samples of shape (n,), got {samples.shape}")
        self._pending += float_to_pcm16(samples)
        self._samples_fed += samples.size
        frame_bytes = 2 * self._frame_samples
        events: list[SpeechStarted | SpeechStopped] = []
        offset = 0
        while len(self._pending) - offset >= frame_bytes:
            event = self._step(bytes(self._pending[offset : offset + frame_bytes]))
            if event is not None:
                events.append(event)
            offset += frame_bytes
        del self._pending[:offset]
        return events

    def _step(self, frame: bytes) -> SpeechStarted | SpeechStopped | None:
        start_ms = self._frame_start_sample * 1000 // self.sample_rate_hz
        self._frame_start_sample += self._frame_samples
        end_ms = self._frame_start_sample * 1000 // self.sample_rate_hz
        if self._vad.is_speech(frame, self.sample_rate_hz):
            if self._run_start_ms is None:
                self._run_start_ms = start_ms
            self._last_voiced_end_ms = end_ms
            if not self._in_speech and end_ms - self._run_start_ms >= _MIN_SPEECH_MS:
                self._in_speech = True
                return SpeechStarted(self._run_start_ms)
            return None
        self._run_start_ms = None
        if self._in_speech and end_ms - self._last_voiced_end_ms >= self.config.silence_duration_ms:
            self._in_speech = False
            return SpeechStopped(self._last_voiced_end_ms)
        return None
