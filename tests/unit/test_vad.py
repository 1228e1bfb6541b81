"""ServerVad on real speech (espeak-ng) placed in silence: event order and times, debounce, turns, chunking, reset."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from voice_gateway.audio.resample import resample
from voice_gateway.audio.vad import ServerVad, SpeechStarted, SpeechStopped, VadConfig

RATE_HZ = 16_000
TOLERANCE_MS = 100
# webrtcvad's hangover (90 ms at the default mode 2, after long speech) is kept in the voiced run, see ServerVad.
END_TOLERANCE_MS = 120


def _espeak(tmp: Path, text: str) -> np.ndarray:
    """Speech at 16 kHz, trimmed to its first and last audible sample so that we know where we place it."""
    wav = tmp / "speech.wav"
    subprocess.run(["espeak-ng", "-w", str(wav), text], check=True)
    samples, rate = sf.read(wav, dtype="float32")
    samples = resample(samples, rate, RATE_HZ)
    audible = np.flatnonzero(np.abs(samples) > 1e-3)
    return samples[audible[0] : audible[-1] + 1]


@pytest.fixture(scope="module")
def hello(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    return _espeak(tmp_path_factory.mktemp("hello"), "Hello there, how are you doing today?")


@pytest.fixture(scope="module")
def sounds_good(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    return _espeak(tmp_path_factory.mktemp("good"), "Yes, that sounds good.")


def _scene(*parts: int | np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Silences (ints, in ms) and speech (arrays) end to end -> the signal and each speech's (start_ms, end_ms)."""
    pieces, spans, at = [], [], 0
    for part in parts:
        piece = np.zeros(part * RATE_HZ // 1000, np.float32) if isinstance(part, int) else part
        if not isinstance(part, int):
            spans.append((at * 1000 // RATE_HZ, (at + piece.size) * 1000 // RATE_HZ))
        pieces.append(piece)
        at += piece.size
    return np.concatenate(pieces), spans


def _feed(vad: ServerVad, signal: np.ndarray, chunk_ms: int) -> list[SpeechStarted | SpeechStopped]:
    step = chunk_ms * RATE_HZ // 1000
    return [event for i in range(0, signal.size, step) for event in vad.feed(signal[i : i + step])]


def _assert_turns(events: list[SpeechStarted | SpeechStopped], spans: list[tuple[int, int]]) -> None:
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped] * len(spans), events
    for (start, stop), (start_ms, end_ms) in zip(zip(events[::2], events[1::2], strict=True), spans, strict=True):
        assert isinstance(start, SpeechStarted) and isinstance(stop, SpeechStopped)
        assert abs(start.audio_start_ms - start_ms) <= TOLERANCE_MS, (start, start_ms)
        assert abs(stop.audio_end_ms - end_ms) <= END_TOLERANCE_MS, (stop, end_ms)


def test_one_utterance_starts_and_stops_where_it_was_placed(hello: np.ndarray) -> None:
    signal, spans = _scene(1000, hello, 1000)
    vad = ServerVad(VadConfig())
    _assert_turns(_feed(vad, signal, 20), spans)
    assert vad.total_ms == signal.size * 1000 // RATE_HZ
    assert not vad.in_speech


def test_speech_stopped_comes_silence_duration_after_the_speech(hello: np.ndarray) -> None:
    signal, _ = _scene(500, hello, 1500)
    for silence_ms in (200, 500, 900):
        vad = ServerVad(VadConfig(silence_duration_ms=silence_ms))
        stops = []
        for i in range(0, signal.size, 160):
            events = vad.feed(signal[i : i + 160])
            stops += [(e.audio_end_ms, vad.total_ms) for e in events if isinstance(e, SpeechStopped)]
        [(audio_end_ms, reported_at_ms)] = stops
        assert reported_at_ms - audio_end_ms == silence_ms


@pytest.mark.parametrize("pause_ms", [800, 1500])
def test_a_pause_longer_than_silence_duration_splits_turns(
    hello: np.ndarray, sounds_good: np.ndarray, pause_ms: int
) -> None:
    signal, spans = _scene(500, hello, pause_ms, sounds_good, 1000)
    _assert_turns(_feed(ServerVad(VadConfig(silence_duration_ms=500)), signal, 30), spans)


def test_a_pause_shorter_than_silence_duration_is_one_turn(hello: np.ndarray, sounds_good: np.ndarray) -> None:
    signal, spans = _scene(500, hello, 300, sounds_good, 1000)
    _assert_turns(_feed(ServerVad(VadConfig(silence_duration_ms=500)), signal, 30), [(spans[0][0], spans[1][1])])


def test_silence_low_noise_and_clicks_start_nothing() -> None:
    rng = np.random.default_rng(0)
    clicks = np.zeros(5 * RATE_HZ, np.float32)
    clicks[RATE_HZ // 2 :: RATE_HZ // 2] = 0.9
    for threshold in (0.0, 0.5, 1.0):
        for signal in (
            np.zeros(5 * RATE_HZ, np.float32),
            rng.normal(0.0, 0.003, 5 * RATE_HZ).astype(np.float32),  # -50 dBFS
            clicks,
        ):
            assert _feed(ServerVad(VadConfig(threshold=threshold)), signal, 20) == []


def test_chunk_size_does_not_change_events(hello: np.ndarray, sounds_good: np.ndarray) -> None:
    signal, _ = _scene(700, hello, 900, sounds_good, 300, hello, 800)
    by_7ms = _feed(ServerVad(VadConfig()), signal, 7)
    assert by_7ms == _feed(ServerVad(VadConfig()), signal, 100)
    assert by_7ms == ServerVad(VadConfig()).feed(signal)
    assert len(by_7ms) == 4


def test_reset_drops_speech_in_progress_and_keeps_the_clock(hello: np.ndarray) -> None:
    vad = ServerVad(VadConfig())
    signal, spans = _scene(500, hello, 1000)
    [started] = _feed(vad, signal[: signal.size // 2], 20)
    assert isinstance(started, SpeechStarted) and vad.in_speech
    vad.reset()
    assert not vad.in_speech
    assert _feed(vad, np.zeros(RATE_HZ, np.float32), 20) == []
    clock_ms = vad.total_ms
    assert clock_ms == (signal.size // 2 + RATE_HZ) * 1000 // RATE_HZ
    _assert_turns(_feed(vad, signal, 20), [(clock_ms + s, clock_ms + e) for s, e in spans])


@pytest.mark.parametrize(("threshold", "mode"), [(0, 0), (0.2, 0), (0.25, 1), (0.5, 2), (0.7, 2), (0.75, 3), (1, 3)])
def test_threshold_maps_to_webrtcvad_mode(threshold: float, mode: int) -> None:
    assert VadConfig(threshold=threshold).aggressiveness == mode


@pytest.mark.parametrize(
    "kwargs", [{"threshold": -0.1}, {"threshold": 1.5}, {"prefix_padding_ms": -1}, {"silence_duration_ms": -1}]
)
def test_bad_config_is_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        VadConfig(**kwargs)


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="sample_rate_hz"):
        ServerVad(VadConfig(), sample_rate_hz=22_050)
    with pytest.raises(ValueError, match="mono"):
        ServerVad(VadConfig()).feed(np.zeros((2, 160), np.float32))
