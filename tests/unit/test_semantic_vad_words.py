"""Semantic turn detection with the words of each pause (real Smart Turn, real Whisper tiny.en, espeak-ng speech): a
sentence with a 300-600 ms pause inside stays one turn, a finished question ends its turn, and words that read as a
finished utterance announce a probable end before it does (a resumption follows when the speaker goes on)."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from engine.cascade.ears import WhisperEars
from tests.unit.test_vad import RATE_HZ, _espeak, _scene
from voice_gateway.audio.semantic_vad import (
    SURE_SILENCE_MS,
    UNSURE_SILENCE_MS,
    ProbableEnd,
    Resumed,
    SemanticConfig,
    SemanticVad,
    TurnChange,
    words_end_a_turn,
)
from voice_gateway.audio.smart_turn import SmartTurnModel, load_smart_turn
from voice_gateway.audio.vad import SpeechStarted, SpeechStopped

# twenty sentences a speaker may pause inside, "I want to book... a table for two"; many halves are sentences too
PAUSED = (
    ("I want to book", "a table for two."), ("Can you tell me", "how far away the moon is?"),
    ("What I would really like is", "a cup of tea."), ("My name is John and I", "need some help."),
    ("Could you please", "turn on the lights?"), ("I need a flight to", "London on Friday."),
    ("What is the", "capital of Spain?"), ("I would like to order a", "large pizza, please."),
    ("Tell me", "a joke about dogs."), ("How long should I", "boil an egg?"),
    ("Set a timer for", "ten minutes."), ("Remind me to call my mother", "at six tonight."),
    ("What time does the sun set", "in Paris this evening?"), ("Play some music", "by the Beatles."),
    ("Can you recommend a good book", "for a long flight?"), ("I was wondering if", "you could help me."),
    ("How do I get to", "the train station?"), ("The weather today is", "cold and rainy, isn't it?"),
    ("Send a message to", "my sister."), ("Add milk and eggs", "to my shopping list."),
)
PADDING_MS = 300  # the turn's prefix padding, as a session commits it


@pytest.fixture(scope="module")
def model() -> SmartTurnModel:
    loaded = load_smart_turn()
    if loaded is None:
        pytest.skip("no Smart Turn model here (pipecat-ai or onnxruntime missing)")
    return loaded


@pytest.fixture(scope="module")
def ears() -> WhisperEars:
    return WhisperEars.from_package(cpu_threads=1, workers=2)


def _turns(model: SmartTurnModel, ears: WhisperEars, signal: np.ndarray,
           chunk_ms: int = 20) -> list[tuple[TurnChange, int]]:
    """Each change with the audio fed when it was reported (ms); each pause heard as a session hears it."""
    with ThreadPoolExecutor(1) as pool:
        def hear(start_ms: int, end_ms: int) -> Future[str]:
            return pool.submit(ears.transcribe, signal[max(0, start_ms - PADDING_MS) * 16 : end_ms * 16])

        vad = SemanticVad(SemanticConfig(), model, hear=hear)
        step = chunk_ms * RATE_HZ // 1000
        return [(change, vad.total_ms) for i in range(0, signal.size, step) for change in vad.feed(signal[i : i + step])]


def test_paused_sentences_stay_one_turn(model: SmartTurnModel, ears: WhisperEars, tmp_path: Path) -> None:
    cut = []
    for index, (first, second) in enumerate(PAUSED):
        pause_ms = 300 + index * 300 // (len(PAUSED) - 1)  # 300 to 600 ms
        signal, spans = _scene(500, _espeak(tmp_path, first), pause_ms, _espeak(tmp_path, second), 2500)
        stops = [at_ms for change, at_ms in _turns(model, ears, signal) if isinstance(change, SpeechStopped)]
        assert stops, (first, second)  # a turn that ends is ended
        assert stops[-1] - spans[-1][1] <= UNSURE_SILENCE_MS + 250, (first, second, stops, spans)
        if len(stops) > 1:
            cut.append((first, second, pause_ms))
    assert len(cut) <= 1, cut  # at most 1 in 20


def test_a_question_is_probably_done_before_its_turn_ends(model: SmartTurnModel, ears: WhisperEars,
                                                         tmp_path: Path) -> None:
    signal, [(_, end_ms)] = _scene(500, _espeak(tmp_path, "What is the capital of France?"), 2000)
    changes = _turns(model, ears, signal)
    assert [type(c) for c, _ in changes] == [SpeechStarted, ProbableEnd, SpeechStopped], changes
    (probable, probable_at_ms), (stopped, stopped_at_ms) = changes[1], changes[2]
    assert isinstance(probable, ProbableEnd) and isinstance(stopped, SpeechStopped)
    assert probable.audio_end_ms == stopped.audio_end_ms  # the reply started on it heard exactly the turn
    assert probable_at_ms < stopped_at_ms and stopped_at_ms - stopped.audio_end_ms >= SURE_SILENCE_MS


def test_a_speaker_who_goes_on_resumes_the_turn(model: SmartTurnModel, ears: WhisperEars, tmp_path: Path) -> None:
    signal, spans = _scene(500, _espeak(tmp_path, "Play some music."), 500, _espeak(tmp_path, "By the Beatles."),
                           2000)
    kinds = [type(c) for c, _ in _turns(model, ears, signal)]
    assert kinds.count(SpeechStopped) == 1 and kinds[-1] is SpeechStopped, kinds
    assert kinds.count(Resumed) == kinds.count(ProbableEnd) - 1, kinds


@pytest.mark.parametrize(("words", "done"), [
    ("What is the capital of France?", True), ("Tell me a story.", True), ("Can you tell me about?", False),
    ("My name is John and I...", False), ("I need a flight to", False), ("Could you please?", False),
    ("", False), ("Hello there!", True), ("\"Really?\"", True), ("Well, um", False),
])
def test_words_end_a_turn(words: str, done: bool) -> None:
    assert words_end_a_turn(words) is done
