"""Semantic turn detection (the Realtime API's `semantic_vad`): webrtcvad finds the pauses, Smart Turn decides
whether a pause ends the turn. At each pause of `PAUSE_MS` the model hears the speech so far; "complete" ends the
turn at once, "incomplete" keeps it open until the speaker goes on, the model changes its mind as the silence
grows (judged again every `REJUDGE_MS`), or the eagerness's longest wait has passed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from voice_gateway.audio.smart_turn import WINDOW_SAMPLES, SmartTurnModel
from voice_gateway.audio.vad import ServerVad, SpeechStarted, SpeechStopped, VadConfig

# A pause this long after the last voiced frame (which webrtcvad's hangover already puts ~100 ms after the sound)
# is judged: the model scores a complete utterance highest with 300-500 ms of silence after it, and a pause of
# 200 ms is the gap between two sentences of one turn.
PAUSE_MS = 300
# A pause judged incomplete is judged again after this much more silence: a longer silence is evidence too.
REJUDGE_MS = 400
# Per eagerness: how sure the model must be, and the longest silence that still waits (OpenAI's 8 / 4 / 2 s).
COMPLETE_PROBABILITY = {"low": 0.7, "medium": 0.5, "auto": 0.5, "high": 0.3}
MAX_WAIT_MS = {"low": 8000, "medium": 4000, "auto": 4000, "high": 2000}
# Audio kept before the speech starts: the model was trained on clips with a little lead-in.
_LEAD_IN_MS = 500


@dataclass(frozen=True, slots=True)
class SemanticConfig:
    """`turn_detection: {"type": "semantic_vad", "eagerness": ...}` settings, plus the VAD's own."""

    eagerness: str = "auto"
    threshold: float = 0.5  # webrtcvad's mode, as for server_vad

    def __post_init__(self) -> None:
        if self.eagerness not in COMPLETE_PROBABILITY:
            raise ValueError(f"eagerness: must be one of {sorted(COMPLETE_PROBABILITY)}, got {self.eagerness!r}")

    @property
    def complete_probability(self) -> float:
        return COMPLETE_PROBABILITY[self.eagerness]

    @property
    def max_wait_ms(self) -> int:
        return MAX_WAIT_MS[self.eagerness]


class SemanticVad:
    """Owns a ServerVad that reports pauses, the last 8 s of audio the model hears, and the pause being held. Same
    interface and events as ServerVad (`SpeechStopped` carries the end of the last voiced frame). `feed` runs the
    model when a pause needs judging, which takes CPU time: call it off the event loop while `in_speech`."""

    def __init__(self, config: SemanticConfig, model: SmartTurnModel, sample_rate_hz: int = 16_000) -> None:
        assert sample_rate_hz == 16_000, f"Smart Turn hears 16 kHz, got {sample_rate_hz}"
        self.config = config
        self.sample_rate_hz = sample_rate_hz
        self._model = model
        self._pauses = ServerVad(VadConfig(config.threshold, 0, PAUSE_MS), sample_rate_hz)
        self.last_probability: float | None = None  # P(complete) of the latest pause judged, for logs and tests
        self.reset()

    def reset(self) -> None:
        """Forget the audio, the pause held and any speech in progress; the clock keeps running."""
        self._pauses.reset()
        self._chunks: list[np.ndarray] = []  # the last WINDOW_SAMPLES + lead-in fed, at least
        self._chunk_samples = 0
        self._speech_start_ms: int | None = None
        self._held: SpeechStopped | None = None  # a pause judged incomplete: the turn waits on it
        self._judged_at_ms = 0

    @property
    def total_ms(self) -> int:
        return self._pauses.total_ms

    @property
    def in_speech(self) -> bool:
        return self._speech_start_ms is not None

    def feed(self, samples: np.ndarray) -> list[SpeechStarted | SpeechStopped]:
        """Float32 mono at 16 kHz, any length; returns the turn starts and ends it completes, in order."""
        changes = self._pauses.feed(samples)
        self._keep(samples.astype(np.float32))
        events: list[SpeechStarted | SpeechStopped] = []
        for change in changes:
            if isinstance(change, SpeechStarted):
                if self._held is not None:
                    self._held = None  # the speaker went on: the turn continues
                elif self._speech_start_ms is None:
                    self._speech_start_ms = change.audio_start_ms
                    events.append(change)
            elif self._speech_start_ms is not None:
                if self._judge_complete(self._speech_start_ms):
                    events.append(self._end(change))
                else:
                    self._held = change
        if self._held is not None and self._speech_start_ms is not None:
            if self.total_ms - self._held.audio_end_ms >= self.config.max_wait_ms:
                events.append(self._end(self._held))
            elif self.total_ms - self._judged_at_ms >= REJUDGE_MS and self._judge_complete(self._speech_start_ms):
                events.append(self._end(self._held))
        return events

    def _keep(self, samples: np.ndarray) -> None:
        self._chunks.append(samples)
        self._chunk_samples += samples.size
        keep = WINDOW_SAMPLES + _LEAD_IN_MS * self.sample_rate_hz // 1000
        while self._chunk_samples - self._chunks[0].size >= keep:
            self._chunk_samples -= self._chunks.pop(0).size

    def _judge_complete(self, speech_start_ms: int) -> bool:
        """The model on the speech since its start (with a lead-in), up to now."""
        audio = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.float32)
        kept_from_ms = self.total_ms - audio.size * 1000 // self.sample_rate_hz
        start = max(0, (speech_start_ms - _LEAD_IN_MS - kept_from_ms) * self.sample_rate_hz // 1000)
        self._judged_at_ms = self.total_ms
        self.last_probability = self._model.probability(audio[start:])
        return self.last_probability >= self.config.complete_probability

    def _end(self, stopped: SpeechStopped) -> SpeechStopped:
        self._speech_start_ms, self._held = None, None
        return stopped
