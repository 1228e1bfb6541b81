"""POST /v1/realtime/calls with a real aiortc peer, in a network namespace of its own (loopback only)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None,
    reason="needs root, unshare and ip to keep the call inside its own network namespace",
)


@pytest.fixture(scope="module")
def spoken_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("webrtc")
    raw = folder / "raw.wav"
    subprocess.run(["espeak-ng", "-w", str(raw), "Hello there. What is the weather like today?"], check=True)
    speech, rate = sf.read(raw, dtype="float32")
    assert np.abs(speech).max() > 0.1
    pad = np.zeros(int(0.5 * rate), np.float32)
    path = folder / "speech.wav"
    sf.write(path, np.concatenate([pad, speech, pad, pad, pad]), rate, subtype="PCM_16")
    return path


def _call(cache_dir: Path, wav: Path, out: Path, *extra: str) -> dict:
    driver = (f"ip link set lo up && exec {sys.executable} -m tests.integration.webrtc_peer "
              f"--cache-dir {cache_dir} --wav {wav} --out {out} {' '.join(extra)}")
    subprocess.run(["unshare", "-n", "sh", "-c", driver], cwd=REPO, check=True, timeout=400,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    return json.loads(out.read_text())


def test_an_aiortc_peer_completes_a_spoken_turn(tiny_checkpoint: Path, cache_dir: Path, spoken_wav: Path,
                                                tmp_path: Path) -> None:
    result = _call(cache_dir, spoken_wav, tmp_path / "call.json")
    assert result["answer_status"] == 201 and result["answer_has_loopback_candidate"]
    events = result["events"]
    assert events[0] == "session.created"
    for kind in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "response.created",
                 "output_audio_buffer.started", "response.done", "output_audio_buffer.stopped"):
        assert kind in events, (kind, events)
    assert "response.output_audio.delta" not in events  # audio travels on the track
    assert result["response_status"] == "completed"
    assert result["received_seconds"] > 1.0 and result["received_peak"] > 0.01
    assert result["health_during"]["active_sessions"] == 1
    after = result["health_after_close"]
    assert after["active_sessions"] == 0 and after["active_requests"] == 0, after
    assert result["user_content"] == [["input_audio"]] and result["image_tokens"] == 0


def test_a_peer_with_a_camera_gets_a_reply_that_used_a_frame(tiny_checkpoint: Path, cache_dir: Path, spoken_wav: Path,
                                                            tmp_path: Path) -> None:
    """The offer's video is accepted (the answer receives it), and the turn's item carries the newest frame, which
    the reply's prompt counted."""
    result = _call(cache_dir, spoken_wav, tmp_path / "call.json", "--video")
    assert result["answer_status"] == 201 and result["answer_video"] == "recvonly"
    assert result["response_status"] == "completed", result["events"]
    assert result["user_content"] == [["input_audio", "input_image"]], result["user_content"]
    assert result["image_tokens"] > 0
    after = result["health_after_close"]
    assert after["active_sessions"] == 0 and after["active_requests"] == 0, after


def test_a_reply_cut_off_over_webrtc_is_truncated_where_its_track_stopped(
        tiny_checkpoint: Path, cache_dir: Path, spoken_wav: Path, tmp_path: Path) -> None:
    """The peer cuts the reply off 400 ms into its playing and sends no truncate: the server truncates the item at
    the audio that left on the track, which is within the item's audio (the page's own estimate could run past it)."""
    result = _call(cache_dir, spoken_wav, tmp_path / "call.json", "--clear-after-ms", "400")
    events = result["events"]
    assert result["errors"] == [], result["errors"]
    assert events.index("output_audio_buffer.cleared") < events.index("conversation.item.truncated"), events
    assert result["response_status"] == "cancelled", events
    # at most what left in the 400 ms after `started` and the cut's trip (the tiny model on a CPU may have made less)
    assert 0 < result["truncated"]["audio_end_ms"] <= 700, result["truncated"]
