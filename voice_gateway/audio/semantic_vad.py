"""Semantic turn detection (the Realtime API's `semantic_vad`): webrtcvad finds the pauses, Smart Turn and, where
the engine hears ahead, the words said so far decide whether a pause ends the turn, and whether a reply may start
before it is sure to.

At each pause the model hears the speech so far. Without the words, "complete" ends the turn at once and
"incomplete" keeps it open until the speaker goes on, the model changes its mind as the silence grows (judged again
every `REJUDGE_MS`), or the eagerness's longest wait has passed. With the words (`hear`: the turn so far transcribed
from a silence's first moments, so mostly before its pause is judged, at a shorter floor), each piece of evidence shortens the silence that ends the turn:
both saying "complete" end it after `SURE_SILENCE_MS`, one of them after `UNSURE_SILENCE_MS`, both longer than a
pause inside a sentence ("I want to book... a table for two", which both may call complete), neither after the
eagerness's longest wait. Words that read as a finished utterance make the pause a `ProbableEnd` at once: a reply
may start on it, and is dropped on `Resumed` should the speaker go on."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

import numpy as np

from voice_gateway.audio.smart_turn import WINDOW_SAMPLES, SmartTurnModel
from voice_gateway.audio.vad import ServerVad, SpeechStarted, SpeechStopped, VadConfig

log = logging.getLogger(__name__)

# A pause this long after the last voiced frame (which webrtcvad's hangover already puts ~100 ms after the sound)
# is judged: the model scores a complete utterance highest with 300-500 ms of silence after it, and a pause of
# 200 ms is the gap between two sentences of one turn.
PAUSE_MS = 300
# With the words as evidence too, a pause is judged sooner, and a reply may start on it; the turn itself ends only
# after a silence longer than the 300-600 ms a speaker pauses inside a sentence, which the voiced run of the speech
# that goes on (150 ms before it is called speech) does not count towards.
HEARD_PAUSE_MS = 150
# The words of a silence start to be heard once it is this long, before it is a pause: should it become one, they
# are the pause's words (the same audio), and the pause is judged sooner.
EARLY_HEAR_MS = 30
SURE_SILENCE_MS = 600
UNSURE_SILENCE_MS = 700
# A pause judged incomplete is judged again after this much more silence: a longer silence is evidence too.
REJUDGE_MS = 400
# Per eagerness: how sure the model must be, and the longest silence that still waits (OpenAI's 8 / 4 / 2 s).
COMPLETE_PROBABILITY = {"low": 0.7, "medium": 0.5, "auto": 0.5, "high": 0.3}
MAX_WAIT_MS = {"low": 8000, "medium": 4000, "auto": 4000, "high": 2000}
# Audio kept before the speech starts: the model was trained on clips with a little lead-in.
_LEAD_IN_MS = 500
# The words of a pause come from the engine, which may be busy: past this the pause is judged on the audio alone.
_HEAR_TIMEOUT_S = 2.0

# (speech start ms, pause's audio_end_ms) on this VAD's clock -> the words said between them, as they arrive
Hear = Callable[[int, int], Future[str]]

# words that lean on the next one: an utterance that ends on one is not done ("Can you tell me about?")
_LEANS_ON_NEXT = frozenset({
    "a", "an", "the", "to", "of", "in", "on", "at", "for", "with", "from", "by", "about", "and", "or", "but", "so",
    "if", "as", "than", "my", "your", "his", "her", "its", "our", "their", "is", "are", "was", "were", "be", "am",
    "i", "we", "they", "not", "very", "can", "will", "would", "should", "could", "do", "does", "did", "have",
    "has", "had", "please", "um", "uh", "like", "because", "that", "which", "who", "what", "where", "when",
})
_WORDS = re.compile(r"[a-z']+")


def words_end_a_turn(text: str) -> bool:
    """The transcript so far reads as a finished utterance: it ends on a sentence's mark (not "..."), after a word
    that does not lean on the next one."""
    text = text.strip().rstrip("\"')]}\u201d\u2019")
    if not text or text[-1] not in ".?!" or text.endswith("..") or text.endswith("\u2026"):
        return False
    words = _WORDS.findall(text.lower())
    return bool(words) and words[-1] not in _LEANS_ON_NEXT


@dataclass(frozen=True, slots=True)
class ProbableEnd:
    """The pause's words read as a finished utterance: the turn may end at `audio_end_ms`."""

    audio_end_ms: int


@dataclass(frozen=True, slots=True)
class Resumed:
    """The speaker went on after a `ProbableEnd`: the turn did not end there."""

    audio_start_ms: int


TurnChange = SpeechStarted | SpeechStopped | ProbableEnd | Resumed


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
    """Owns a ServerVad that reports pauses, the last 8 s of audio the model hears, the pause being held and its words.
    Same interface and events as ServerVad (`SpeechStopped` carries the end of the last voiced frame). `feed` runs the
    model, and waits for `hear`'s words, when a pause needs judging: call it off the event loop while `in_speech`."""

    def __init__(self, config: SemanticConfig, model: SmartTurnModel, sample_rate_hz: int = 16_000,
                 hear: Hear | None = None) -> None:
        assert sample_rate_hz == 16_000, f"Smart Turn hears 16 kHz, got {sample_rate_hz}"
        self.config = config
        self.sample_rate_hz = sample_rate_hz
        self._model = model
        self._hear = hear
        pause_ms = PAUSE_MS if hear is None else HEARD_PAUSE_MS
        self._pauses = ServerVad(VadConfig(config.threshold, 0, pause_ms), sample_rate_hz)
        self.last_probability: float | None = None  # P(complete) of the latest pause judged, for logs and tests
        self.last_words: str | None = None  # what `hear` said of the latest pause
        self.reset()

    def reset(self) -> None:
        """Forget the audio, the pause held and any speech in progress; the clock keeps running."""
        self._pauses.reset()
        self._chunks: list[np.ndarray] = []  # the last WINDOW_SAMPLES + lead-in fed, at least
        self._chunk_samples = 0
        self._speech_start_ms: int | None = None
        self._held: SpeechStopped | None = None  # a pause not yet judged the end: the turn waits on it
        self._held_for_ms = 0  # the silence after the held pause's last voiced frame that ends the turn
        # the held pause's words: hearing them starts at the pause and runs while the model judges (None: not heard)
        self._words: Future[str] | str | None = None
        self._probable = False  # the held pause was announced as a ProbableEnd
        self._early: tuple[int, Future[str]] | None = None  # the words of the silence since (ms), heard early
        self._judged_at_ms = 0

    @property
    def total_ms(self) -> int:
        return self._pauses.total_ms

    @property
    def in_speech(self) -> bool:
        return self._speech_start_ms is not None

    def feed(self, samples: np.ndarray) -> list[TurnChange]:
        """Float32 mono at 16 kHz, any length; returns the turn starts and ends it completes, in order (with `hear`,
        the probable ends and resumptions too)."""
        changes = self._pauses.feed(samples)
        self._keep(samples.astype(np.float32))
        events: list[TurnChange] = []
        for change in changes:
            if isinstance(change, SpeechStarted):
                if self._held is not None:
                    self._held = None  # the speaker went on: the turn continues
                    if self._probable:
                        self._probable = False
                        events.append(Resumed(change.audio_start_ms))
                elif self._speech_start_ms is None:
                    self._speech_start_ms = change.audio_start_ms
                    events.append(change)
            elif self._speech_start_ms is not None:
                self._held = change
                self._words = self._words_until(self._speech_start_ms, change.audio_end_ms)
                self._held_for_ms = self._silence_to_end(self._speech_start_ms)
                if self._held_for_ms == 0:  # sure at the pause; a later change in this feed is a new turn's
                    events.append(self._end(change))
                elif self._probable:
                    events.append(ProbableEnd(change.audio_end_ms))
        if self._hear is not None and self._held is None and self._speech_start_ms is not None:
            self._hear_early(self._speech_start_ms)
        if self._held is not None and self._speech_start_ms is not None:
            # speech that goes on is silence until its run is long enough to be called speech: it does not count
            run_start_ms = self._pauses.voiced_run_start_ms
            silence_ms = (self.total_ms if run_start_ms is None else run_start_ms) - self._held.audio_end_ms
            if silence_ms < self._held_for_ms and self.total_ms - self._judged_at_ms >= REJUDGE_MS \
                    and silence_ms < self.config.max_wait_ms:
                self._held_for_ms = self._silence_to_end(self._speech_start_ms)
            if silence_ms >= min(self._held_for_ms, self.config.max_wait_ms):
                events.append(self._end(self._held))
        return events

    def _hear_early(self, speech_start_ms: int) -> None:
        """A silence inside the speech, long enough: its words start to be heard (one hearing at a time)."""
        assert self._hear is not None
        since_ms = self._pauses.silent_since_ms
        if since_ms is None or self.total_ms - since_ms < EARLY_HEAR_MS:
            return
        if self._early is None or (self._early[0] != since_ms and self._early[1].done()):
            self._early = (since_ms, self._hear(speech_start_ms, since_ms))

    def _words_until(self, speech_start_ms: int, end_ms: int) -> Future[str] | None:
        if self._hear is None:
            return None
        if self._early is not None and self._early[0] == end_ms:
            return self._early[1]
        return self._hear(speech_start_ms, end_ms)

    def _keep(self, samples: np.ndarray) -> None:
        self._chunks.append(samples)
        self._chunk_samples += samples.size
        keep = WINDOW_SAMPLES + _LEAD_IN_MS * self.sample_rate_hz // 1000
        while self._chunk_samples - self._chunks[0].size >= keep:
            self._chunk_samples -= self._chunks.pop(0).size

    def _silence_to_end(self, speech_start_ms: int) -> int:
        """The model on the speech since its start (with a lead-in), up to now, with the pause's words if heard ->
        the silence after the pause's last voiced frame that ends the turn."""
        audio = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.float32)
        kept_from_ms = self.total_ms - audio.size * 1000 // self.sample_rate_hz
        start = max(0, (speech_start_ms - _LEAD_IN_MS - kept_from_ms) * self.sample_rate_hz // 1000)
        self._judged_at_ms = self.total_ms
        self.last_probability = p = self._model.probability(audio[start:])
        model_says_done = p >= self.config.complete_probability
        words = self._words_of_pause()
        if not words:  # not heard, or nothing Whisper would call words: the model alone decides
            return 0 if model_says_done else self.config.max_wait_ms
        words_say_done = self._probable = words_end_a_turn(words)
        if model_says_done and words_say_done:
            return SURE_SILENCE_MS
        return UNSURE_SILENCE_MS if model_says_done or words_say_done else self.config.max_wait_ms

    def _words_of_pause(self) -> str | None:
        heard = self._words
        if isinstance(heard, Future):
            try:
                heard = heard.result(timeout=_HEAR_TIMEOUT_S)
            except FutureTimeout:
                log.info("semantic_vad: the words of a pause took over %.1f s: judged on the audio alone",
                         _HEAR_TIMEOUT_S)
                heard = None
            except Exception:  # noqa: BLE001 - a failed hearing leaves the audio's judgement, never the turn broken
                log.exception("semantic_vad: hearing a pause failed")
                heard = None
            self._words = heard
        self.last_words = heard
        return heard

    def _end(self, stopped: SpeechStopped) -> SpeechStopped:
        self._speech_start_ms, self._held, self._words, self._probable, self._early = None, None, None, False, None
        return stopped
