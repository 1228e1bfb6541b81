"""The assistant's fallbacks, real: festival's slt voice speaks clauses that Whisper hears back with few
word errors; pocketsphinx hears that voice's clear speech; the profile's `cascade` section picks them, and the
assistant built on both answers a spoken question with speech.

The figures in docs/deployment.md come from `python -m pytest tests/unit/test_cascade_fallbacks.py -s -q`."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soxr

from benchmarks.voice.make_questions import speak
from engine import AudioChunk, AudioPart, EngineRequest, Finished, Message, SamplingParams, TextDelta, create_engine
from engine.api import EngineError
from engine.cascade.ears import WhisperEars
from engine.cascade.festival import INSTALL, FestivalVoice
from engine.cascade.sphinx import SphinxEars
from engine.profile import ProfileError, load_profile
from tests.unit.test_assistant import edits, words

needs_festival = pytest.mark.skipif(
    shutil.which("text2wave") is None or not Path("/usr/share/festival/voices/us/cmu_us_slt_arctic_hts").is_dir(),
    reason=f"festival or its slt voice is not installed ({INSTALL})")

SENTENCES = (
    "What is the capital of France?",
    "The weather today is sunny and warm.",
    "Please turn off the lights in the kitchen.",
    "I would like to book a table for two people.",
    "How many days are there in a week?",
    "Can you tell me a story about a dragon?",
    "My favorite color is blue.",
    "What time does the train leave for London?",
    "The quick brown fox jumps over the lazy dog.",
    "Remind me to call my mother tomorrow evening.",
    "How far is it from the station to the museum?",
    "Could you play some quiet music while I read?",
    "We need to buy bread, milk and a dozen eggs.",
    "Which planet is the largest in our solar system?",
    "The meeting has been moved to next Thursday afternoon.",
    "Thank you, that was very helpful.",
)
# as the speaking stage cuts a reply: a short first clause (at most 5 words), then the rest
CLAUSES = ("The capital of France", "is Paris.", "Bees make honey,", "which they keep in their hives.", "Sure.")
FALLBACKS = {"cascade": {"ears": "pocketsphinx", "voice": "festival"}}


@pytest.fixture(scope="module")
def festival() -> FestivalVoice:
    return FestivalVoice.load()


@pytest.fixture(scope="module")
def whisper() -> WhisperEars:
    return WhisperEars.from_package(cpu_threads=1, workers=1)


@pytest.fixture(scope="module")
def sphinx() -> SphinxEars:
    pytest.importorskip("pocketsphinx", reason="pocketsphinx is not installed (the assistant-fallbacks extra)")
    return SphinxEars.load()


@pytest.fixture(scope="module")
def festival_speech(festival: FestivalVoice) -> list[np.ndarray]:
    """SENTENCES spoken by festival, at the ears' 16 kHz."""
    return [soxr.resample(festival.synthesize(s), 24_000, 16_000).astype(np.float32) for s in SENTENCES]


def word_error(heard: list[str]) -> float:
    counts = [edits(said, text) for said, text in zip(SENTENCES, heard, strict=True)]
    return sum(e for e, _ in counts) / sum(n for _, n in counts)


def test_the_profile_picks_the_fallbacks_per_role() -> None:
    default = load_profile(model="assistant", platform="cpu").cascade
    assert (default.ears, default.voice) == ("whisper", "piper")
    picked = load_profile(model="assistant", platform="cpu", overrides=FALLBACKS).cascade
    assert (picked.ears, picked.voice) == ("pocketsphinx", "festival")
    with pytest.raises(ProfileError, match=r"^cascade\.voice: must be one of piper, festival, got 'espeak'"):
        load_profile(model="assistant", platform="cpu", overrides={"cascade": {"voice": "espeak"}})
    with pytest.raises(ProfileError, match=r"^cascade: only with backend: cascade, got backend: omni"):
        load_profile(model="tiny", platform="cpu", overrides={"cascade": {"ears": "pocketsphinx"}})


def test_espeak_ng_speaks_a_sentence_that_whisper_hears(whisper: WhisperEars) -> None:
    """The baseline the festival voice is measured against: the tests' own synthetic speaker."""
    heard = [whisper.transcribe(speak(s)) for s in SENTENCES]
    print(f"\nespeak-ng heard by Whisper tiny.en: {word_error(heard):.1%} word error over {len(SENTENCES)} sentences")
    assert "capital" in words(heard[0]) and "france" in words(heard[0]), heard[0]


@needs_festival
def test_festival_speaks_clauses_that_whisper_hears_back(festival: FestivalVoice, whisper: WhisperEars) -> None:
    started = time.perf_counter()
    audio = [festival.synthesize(s) for s in SENTENCES]
    per_clause_s = (time.perf_counter() - started) / len(SENTENCES)
    assert all(a.dtype == np.float32 and a.ndim == 1 and 1.0 < a.size / 24_000 < 5.0 for a in audio)
    assert all(0.05 < np.abs(a).max() <= 1.0 for a in audio)
    started = time.perf_counter()
    assert all(festival.synthesize(c).size for c in CLAUSES)
    per_short_clause_s = (time.perf_counter() - started) / len(CLAUSES)
    heard = [whisper.transcribe(soxr.resample(a, 24_000, 16_000).astype(np.float32)) for a in audio]
    error = word_error(heard)
    seconds = sum(a.size for a in audio) / 24_000
    print(f"\nfestival (slt) heard by Whisper tiny.en: {error:.1%} word error over {len(SENTENCES)} sentences; "
          f"{per_clause_s:.2f} s a sentence ({per_clause_s * len(SENTENCES) / seconds:.2f} s per second of speech), "
          f"{per_short_clause_s:.2f} s a clause of 1-5 words")
    assert error <= 0.08, list(zip(SENTENCES, heard, strict=True))
    np.testing.assert_array_equal(festival.synthesize(SENTENCES[0], seed=5), audio[0])  # HTS draws no noise


@needs_festival
@pytest.mark.parametrize("text", ["", "   \n", "...!?", "\U0001f642\U0001f389", "\u2014 * \u2014"])
def test_festival_says_nothing_for_nothing_speakable(festival: FestivalVoice, text: str) -> None:
    audio = festival.synthesize(text)
    assert audio.dtype == np.float32 and audio.shape == (0,)


@needs_festival
def test_festival_folds_what_its_lexicon_cannot_read(festival: FestivalVoice, whisper: WhisperEars) -> None:
    heard = whisper.transcribe(soxr.resample(festival.synthesize("Caf\u00e9 au lait \U0001f642, please."), 24_000,
                                             16_000).astype(np.float32))
    assert "please" in words(heard), heard


def test_festival_missing_is_an_error_naming_the_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EngineError, match="apt-get install festival festvox-us-slt-hts"):
        FestivalVoice.load()


@needs_festival
def test_pocketsphinx_hears_festivals_clear_speech(sphinx: SphinxEars, festival_speech: list[np.ndarray]) -> None:
    started = time.perf_counter()
    heard = [sphinx.transcribe(audio) for audio in festival_speech]
    per_utterance_s = (time.perf_counter() - started) / len(heard)
    error = word_error(heard)
    print(f"\npocketsphinx heard festival (slt): {error:.1%} word error over {len(SENTENCES)} sentences, "
          f"{per_utterance_s:.2f} s an utterance")
    assert {"capital", "france"} <= set(words(heard[0])), heard[0]
    assert error <= 0.25, list(zip(SENTENCES, heard, strict=True))


def test_pocketsphinx_on_espeak_ng_and_silence(sphinx: SphinxEars) -> None:
    """Weak on espeak-ng's speech (measured, not held to a bound); silence is no words, where its decoder alone
    makes a word of zeros."""
    heard = [sphinx.transcribe(speak(s)) for s in SENTENCES]
    print(f"\npocketsphinx heard espeak-ng: {word_error(heard):.1%} word error over {len(SENTENCES)} sentences")
    assert sphinx.transcribe(np.zeros(32_000, np.float32)) == ""
    assert sphinx.transcribe(np.zeros(0, np.float32)) == ""


def test_pocketsphinx_missing_is_an_error_naming_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pocketsphinx", None)  # what an uninstalled package imports as
    with pytest.raises(EngineError, match=r"pip install pocketsphinx==5\.1\.1"):
        SphinxEars.load()


@needs_festival
@pytest.mark.slow
async def test_the_assistant_on_the_fallbacks_answers_speech_with_speech(
        cache_dir: Path, festival: FestivalVoice, whisper: WhisperEars, sphinx: SphinxEars) -> None:
    profile = load_profile(model="assistant", platform="cpu", overrides=FALLBACKS)
    engine = create_engine("assistant", profile, cache_dir)
    assert engine.info.speakers == ("slt",)
    assert "pocketsphinx" in engine.info.description and "festival" in engine.info.description
    question = soxr.resample(festival.synthesize("What is the capital of France?"), 24_000, 16_000)
    await engine.start()
    try:
        request = EngineRequest("capital", (Message("user", (AudioPart(question.astype(np.float32)),)),),
                                want_audio=True, sampling=SamplingParams(seed=3))
        events = [event async for event in await engine.submit(request)]
    finally:
        await engine.stop()
    assert isinstance(events[-1], Finished), events[-1]
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    audio = np.concatenate([e.samples for e in events if isinstance(e, AudioChunk)])
    assert "paris" in words(text), text
    assert audio.size / 24_000 > 0.5
    errors, total = edits(text, whisper.transcribe(soxr.resample(audio, 24_000, 16_000).astype(np.float32)))
    assert errors / total <= 0.25, (text, errors, total)


def test_the_cascade_has_its_own_keys_and_each_voice_its_one_speaker() -> None:
    """The cascade's roles are `cascade.ears`, `brain` and `voice`, never the Omni stages' keys; the voice picks its
    speaker (no model loads to say so)."""
    from engine.cascade.backend import CascadeBackend

    with pytest.raises(ProfileError, match=r"^stages: the cascade's stages are set by cascade\.ears, cascade\.brain "
                       r"and cascade\.voice"):
        load_profile(model="assistant", platform="cpu", overrides={"stages": {"talker": {"default_speaker": "slt"}}})
    festival = load_profile(model="assistant", platform="cpu", overrides={"cascade": {"voice": "festival"}})
    assert CascadeBackend(festival).info.speakers == ("slt",)
    assert CascadeBackend(load_profile(model="assistant", platform="cpu")).info.speakers == ("joe",)
    brain = load_profile(model="assistant", platform="cpu", overrides={"cascade": {"brain": {"max_batch": 2}}})
    assert brain.cascade.brain.max_batch == 2 and brain.cascade.brain.max_model_len == 4096


@needs_festival
def test_festival_streams_a_clause_as_one_piece(festival: FestivalVoice) -> None:
    (piece,) = festival.stream(CLAUSES[0])
    np.testing.assert_array_equal(piece, festival.synthesize(CLAUSES[0]))
    assert list(festival.stream("\U0001f642")) == []
