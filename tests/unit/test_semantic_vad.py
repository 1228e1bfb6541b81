"""SemanticVad (Smart Turn on onnxruntime) on espeak-ng speech: complete turns end soon after the speech, a
mid-sentence pause does not end one, and turn taking falls back to the server VAD where the model is absent."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.unit.test_vad import END_TOLERANCE_MS, RATE_HZ, _espeak, _feed, _scene
from voice_gateway.audio import smart_turn
from voice_gateway.audio.semantic_vad import SemanticConfig, SemanticVad
from voice_gateway.audio.smart_turn import SmartTurnModel, load_smart_turn
from voice_gateway.audio.vad import ServerVad, SpeechStarted, SpeechStopped, VadConfig
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.turns import TurnTaking

# A complete utterance's turn ends within this much audio after its last sound: webrtcvad's hangover (~100 ms),
# the pause that is judged (300 ms) and one 20 ms append. The server VAD's default needs ~600 ms.
END_WITHIN_MS = 450
UTTERANCES = ("Hello there, how are you doing today?", "Yes, that sounds good.", "What time is it?",
              "Hello there. What is the weather like today?")


@pytest.fixture(scope="module")
def model() -> SmartTurnModel:
    loaded = load_smart_turn()
    if loaded is None:
        pytest.skip("no Smart Turn model here (pipecat-ai or onnxruntime missing)")
    return loaded


@pytest.fixture(scope="module")
def spoken(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    texts = (*UTTERANCES, "I would like to order, um", "a large pizza, please.")
    return {text: _espeak(tmp_path_factory.mktemp("say"), text) for text in texts}


def _turns_with_report_times(vad: ServerVad | SemanticVad, signal: np.ndarray,
                             chunk_ms: int = 20) -> list[tuple[SpeechStarted | SpeechStopped, int, float]]:
    """Each event with the audio fed when it was reported (ms) and the wall time of the feed that reported it (s)."""
    step = chunk_ms * RATE_HZ // 1000
    reported = []
    for i in range(0, signal.size, step):
        began = time.perf_counter()
        events = vad.feed(signal[i : i + step])
        reported += [(event, vad.total_ms, time.perf_counter() - began) for event in events]
    return reported


@pytest.mark.parametrize("text", UTTERANCES[:2])
def test_a_complete_utterance_ends_its_turn_soon_after_the_speech(
    model: SmartTurnModel, spoken: dict[str, np.ndarray], text: str
) -> None:
    signal, [(start_ms, end_ms)] = _scene(500, spoken[text], 3000)
    vad = SemanticVad(SemanticConfig(), model)
    [(started, _, _), (stopped, stopped_at_ms, _)] = _turns_with_report_times(vad, signal)
    assert isinstance(started, SpeechStarted) and isinstance(stopped, SpeechStopped)
    assert abs(started.audio_start_ms - start_ms) <= 100, (started, start_ms)
    assert abs(stopped.audio_end_ms - end_ms) <= END_TOLERANCE_MS, (stopped, end_ms)
    assert stopped_at_ms - end_ms <= END_WITHIN_MS, (stopped_at_ms, end_ms, vad.last_probability)
    assert not vad.in_speech


def test_a_mid_sentence_pause_does_not_end_the_turn(model: SmartTurnModel, spoken: dict[str, np.ndarray]) -> None:
    signal, [(start_ms, _), (_, end_ms)] = _scene(500, spoken["I would like to order, um"], 800,
                                                  spoken["a large pizza, please."], 5000)
    # the server VAD's 500 ms of silence splits the sentence in two
    assert len(_feed(ServerVad(VadConfig()), signal, 20)) == 4
    events = _feed(SemanticVad(SemanticConfig(), model), signal, 20)
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped], events
    assert abs(events[0].audio_start_ms - start_ms) <= 100
    assert abs(events[1].audio_end_ms - end_ms) <= END_TOLERANCE_MS


def test_silence_and_chunking(model: SmartTurnModel, spoken: dict[str, np.ndarray]) -> None:
    assert _feed(SemanticVad(SemanticConfig(), model), np.zeros(3 * RATE_HZ, np.float32), 20) == []
    signal, _ = _scene(500, spoken["What time is it?"], 1500)
    assert _feed(SemanticVad(SemanticConfig(), model), signal, 20) == \
        _feed(SemanticVad(SemanticConfig(), model), signal, 100)


def test_semantic_ends_turns_sooner_than_server_vad(model: SmartTurnModel, spoken: dict[str, np.ndarray]) -> None:
    """End of speech -> commit on each test utterance, as the audio after the speech plus the model's time.

    `-s` prints the table that docs/performance/conversations.md quotes."""
    rows = []
    for text in UTTERANCES:
        signal, [(_, end_ms)] = _scene(500, spoken[text], 5000)
        times = {}
        for name, vad in (("server_vad", ServerVad(VadConfig())), ("semantic_vad", SemanticVad(SemanticConfig(),
                                                                                               model))):
            stops = [(at_ms, wall_s) for event, at_ms, wall_s in _turns_with_report_times(vad, signal)
                     if isinstance(event, SpeechStopped)]
            assert len(stops) == 1, (name, text, stops)
            times[name] = stops[0][0] - end_ms, stops[0][1] * 1000
        rows.append((text, times))
        assert times["semantic_vad"][0] < times["server_vad"][0], (text, times)
    print("\nutterance | server_vad audio ms | semantic_vad audio ms | semantic_vad model ms")
    for text, times in rows:
        print(f"{text} | {times['server_vad'][0]} | {times['semantic_vad'][0]} | {times['semantic_vad'][1]:.0f}")


def test_bad_eagerness_is_rejected() -> None:
    with pytest.raises(ValueError, match="eagerness"):
        SemanticConfig(eagerness="eager")


# -- the fallback
def test_a_missing_model_or_runtime_is_logged_once_and_gives_none(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.WARNING, smart_turn.__name__)
    missing = tmp_path / "missing.onnx"
    assert load_smart_turn(missing) is None
    assert load_smart_turn(missing) is None
    assert [r.getMessage() for r in caplog.records if "no Smart Turn model" in r.getMessage()] == \
        [f"semantic_vad: no Smart Turn model ({missing}); turns end on the server VAD's silence instead "
         "(pip install 'voice-gateway[semantic-vad]' installs the model)"]
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime raises ImportError
    assert load_smart_turn(tmp_path / "other.onnx") is None
    assert "onnxruntime is not installed" in caplog.text


async def test_turn_taking_falls_back_to_the_server_vad_without_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("voice_gateway.realtime.turns.load_smart_turn", lambda: None)
    turns = TurnTaking()
    turns.configure(ev.TurnDetection(type="semantic_vad", eagerness="high"), 0)
    assert isinstance(turns.vad, ServerVad)
    assert turns.vad.config.silence_duration_ms == ev.SEMANTIC_SILENCE_MS["high"]


async def test_turn_taking_runs_the_model_for_semantic_vad(model: SmartTurnModel,
                                                           spoken: dict[str, np.ndarray]) -> None:
    turns = TurnTaking()
    turns.configure(ev.TurnDetection(type="semantic_vad"), 1000)
    assert isinstance(turns.vad, SemanticVad)
    signal, [(_, end_ms)] = _scene(500, spoken["What time is it?"], 1500)
    changes = [change for i in range(0, signal.size, 320) for change in await turns.feed(signal[i : i + 320])]
    assert [type(c) for c in changes] == [ev.SpeechStarted, ev.SpeechStopped]
    assert abs(changes[1].audio_end_ms - (1000 + end_ms)) <= END_TOLERANCE_MS
