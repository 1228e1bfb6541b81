"""What the assistant's ears understand over a phone line (G.711 µ-law at 8 kHz, as a Twilio, Telnyx or Plivo
call carries the caller) against the same speech at 16 kHz: ten questions spoken by Piper, a neural voice with
natural speech's spectrum, lose nothing through the line. espeak-ng's formant speech puts much of its consonants
above the line's 4 kHz and loses a third of its words there (printed), so the phone tests check words on the
replies, not on the questions' transcripts."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from benchmarks.voice.make_questions import speak
from engine.cascade.ears import WhisperEars
from engine.cascade.voice import PiperVoice
from tests.unit.test_assistant import edits
from voice_gateway.audio.g711 import G711_SAMPLE_RATE_HZ, ulaw_decode, ulaw_encode
from voice_gateway.audio.resample import Resampler

QUESTIONS = ("What is the capital of France?", "What time is it in Tokyo?", "Tell me a joke about cats.",
             "How far away is the moon?", "Can you book a table for two tonight?",
             "What is the weather like in London?", "Please turn on the kitchen lights.",
             "Who wrote Romeo and Juliet?", "How many days are in a leap year?", "Play some relaxing music for me.")


@pytest.fixture(scope="module")
def ears() -> WhisperEars:
    return WhisperEars.from_package(cpu_threads=1, workers=1)


def _through_the_line(speech_16k: np.ndarray) -> np.ndarray:
    """The caller's speech as the server hears it: the carrier's 8 kHz µ-law, then the call's own resampler."""
    line = ulaw_encode(soxr.resample(speech_16k, 16_000, G711_SAMPLE_RATE_HZ).astype(np.float32))
    up = Resampler(G711_SAMPLE_RATE_HZ, 16_000)
    return np.concatenate([up.process(ulaw_decode(line)), up.flush()]).astype(np.float32)


def _word_error(ears: WhisperEars, clips: list[np.ndarray]) -> float:
    counts = [edits(said, ears.transcribe(clip)) for said, clip in zip(QUESTIONS, clips, strict=True)]
    return sum(e for e, _ in counts) / sum(n for _, n in counts)


def test_natural_speech_loses_nothing_through_the_line(ears: WhisperEars) -> None:
    voice = PiperVoice.load(threads=1)
    wide = [soxr.resample(voice.synthesize(q), 24_000, 16_000).astype(np.float32) for q in QUESTIONS]
    wide_error, line_error = _word_error(ears, wide), _word_error(ears, [_through_the_line(c) for c in wide])
    print(f"\nPiper's questions heard by Whisper tiny.en: {wide_error:.1%} word error at 16 kHz, "
          f"{line_error:.1%} through an 8 kHz µ-law line")
    assert line_error <= max(0.08, wide_error + 0.03), (wide_error, line_error)
    # the tests' own speaker, for the record: what the line takes from formant speech is its speaker's, not ours
    wide = [speak(q) for q in QUESTIONS]
    print(f"espeak-ng's questions: {_word_error(ears, wide):.1%} at 16 kHz, "
          f"{_word_error(ears, [_through_the_line(c) for c in wide]):.1%} through the line")
