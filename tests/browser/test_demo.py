"""The browser demo (web/) in headless Chromium with a fake microphone, against a real server, on loopback only.

Every test runs tests/browser/driver.py in a network namespace of its own (see conftest.py) and asserts on what
the page itself reported through `window.voiceDemo` (web/test-hooks.js) and what `/health` said. A screenshot of each run is saved in
the test's tmp dir. No timing assertions beyond generous timeouts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.harness import explain, run_driver, unavailable_reason

_reason = unavailable_reason()
if _reason is not None:
    pytest.skip(_reason, allow_module_level=True)


def _assert_turn(result: dict, out_dir: Path, transport: str) -> dict:
    why = explain(result, out_dir)
    assert result["connect_error"] is None, why
    assert "wait_error" not in result, why
    page = result["page"]
    stats = page["stats"]
    assert stats["transport"] == transport, why
    assert stats["errors"] == [], why
    assert stats["responsesCompleted"] >= 1 and stats["lastResponseStatus"] == "completed", why
    assert stats["eventCounts"].get("input_audio_buffer.speech_stopped", 0) >= 1, why
    assert stats["lastLatencyMs"] is not None and stats["lastLatencyMs"] > 0, why
    assert stats["medianLatencyMs"] is not None, why
    reply = page["replies"][0]
    assert reply["status"] == "completed" and reply["text"], why
    assert reply["latencyMs"] == stats["latenciesMs"][0], why
    assert result["random_notice_visible"], "the page must say the model has random weights"
    assert result["transcript_html_turns"] >= 2, why  # the user's "speech, N s" and the assistant's reply
    freed, snapshots = result["health_after_close"]
    assert freed, f"the session outlived its page: {snapshots}"
    return stats


def _assert_no_images(result: dict, why: str) -> None:
    """The video off: the page sent no image, the server added none to a turn, and no turn shows a thumbnail."""
    stats = result["page"]["stats"]
    sent_items = [e for e in result["wire"] if e["dir"] == "sent" and e["type"] == "conversation.item.create"]
    assert sent_items == [], why
    assert all("input_image" not in item["content"] for item in stats["userItems"]), why
    assert all(r["imageTokens"] == 0 for r in stats["responses"]) and stats["framesWithTurns"] == 0, why
    assert all(user["frame"] is None for user in result["dom"]["users"]), why


def test_a_turn_over_websocket_opus(tiny_checkpoint: Path, cache_dir: Path, fake_mic_wav: Path, tmp_path: Path) -> None:
    result = run_driver("ws-opus-turn", fake_mic_wav, cache_dir, tmp_path)
    stats = _assert_turn(result, tmp_path, "ws-opus")
    why = explain(result, tmp_path)
    assert stats["packetsReceived"] > 0 and stats["packetsLost"] == 0, why  # binary Opus packets
    assert stats["audioMsReceived"] > 0 and stats["audioSamplesPlayed"] > 0, why  # decoded by WebCodecs, played
    assert result["video_control"] == {"disabled": False, "title": ""}, why  # the tiny model sees images
    _assert_no_images(result, why)
    assert (tmp_path / "ws-opus-turn.png").stat().st_size > 0


def test_the_assistant_answers_a_spoken_turn_in_words(cache_dir: Path, fake_mic_wav: Path, tmp_path: Path) -> None:
    """The default model in the page: it names the assistant, shows no random-weights notice, and its reply to
    the microphone's question is English text, spoken; the page shows the words it heard and where the wait went."""
    result = run_driver("ws-opus-turn", fake_mic_wav, cache_dir, tmp_path, model="assistant")
    why = explain(result, tmp_path)
    assert result["connect_error"] is None and "wait_error" not in result, why
    assert result["model_pill"] == "assistant" and not result["random_notice_visible"], why
    assert result["video_control"]["disabled"], why  # the assistant takes no images
    stats = result["page"]["stats"]
    assert stats["errors"] == [] and stats["lastResponseStatus"] == "completed", why
    assert stats["audioSamplesPlayed"] > 0, why
    reply = result["page"]["replies"][0]["text"]
    assert len([w for w in reply.split() if w.strip(".,!?'\"").isalpha()]) >= 3, why
    # it transcribes anyway, so the page shows the words it heard, not "speech, N s"
    [user, *_] = result["dom"]["users"]
    assert "weather" in user["text"].lower(), why
    # and its latency card splits the wait, from the server's response.timing
    split = stats["latencySplit"]
    assert split is not None, why
    assert all(split[k] is not None for k in ("totalMs", "turnMs", "earsMs", "brainMs", "voiceMs", "networkMs")), why
    assert 0 < split["turnMs"] < split["totalMs"] and split["networkMs"] >= 0, why


def test_a_turn_over_webrtc(tiny_checkpoint: Path, cache_dir: Path, fake_mic_wav: Path, tmp_path: Path) -> None:
    result = run_driver("webrtc-turn", fake_mic_wav, cache_dir, tmp_path)
    stats = _assert_turn(result, tmp_path, "webrtc")
    why = explain(result, tmp_path)
    assert stats["packetsReceived"] > 0, why  # RTP packets of the reply track
    assert stats["eventCounts"].get("output_audio_buffer.started", 0) >= 1, why
    assert "response.output_audio.delta" not in stats["eventCounts"], why  # audio comes on the track, not as events
    # The offer always holds a video transceiver, so the camera can join mid-call; off, it sends no frame.
    assert result["offer_media"] == {"audio": "sendrecv", "video": "sendonly", "application": ""}, why
    _assert_no_images(result, why)
    assert (tmp_path / "webrtc-turn.png").stat().st_size > 0


@pytest.mark.parametrize("transport", ["ws-opus", "webrtc"])
def test_closing_the_page_frees_the_session(
    tiny_checkpoint: Path, cache_dir: Path, fake_mic_wav: Path, tmp_path: Path, transport: str
) -> None:
    """The page is closed while a reply is under way: /health must show no session and no request soon after."""
    result = run_driver(f"{transport}-close", fake_mic_wav, cache_dir, tmp_path)
    why = explain(result, tmp_path)
    assert result["connect_error"] is None, why
    assert "wait_error" not in result, why
    assert result["health_connected"]["active_sessions"] == 1, why
    assert result["page"]["stats"]["eventCounts"].get("response.created", 0) >= 1, why
    assert result["freed"], f"not freed within 10 s of closing the page: {result['health_after_close']}\n{why}"
    assert (tmp_path / f"{transport}-close.png").stat().st_size > 0


@pytest.mark.parametrize("transport", ["ws-pcm16", "webrtc"])
def test_barge_in_stops_the_reply_and_truncates_it(
    tiny_checkpoint: Path, cache_dir: Path, barge_in_wav: Path, tmp_path: Path, transport: str
) -> None:
    """The fake user speaks again while the reply plays: the page drops the rest and tells the server what was heard."""
    result = run_driver(f"{transport}-barge-in", barge_in_wav, cache_dir, tmp_path)
    why = explain(result, tmp_path)
    assert result["connect_error"] is None, why
    assert "wait_error" not in result, why
    page = result["page"]
    stats = page["stats"]
    assert stats["errors"] == [], why
    assert stats["bargeIns"] >= 1 and stats["truncationsAcked"] >= 1, why
    interrupted = [r for r in page["replies"] if r["interrupted"]]
    assert interrupted, why
    if transport != "webrtc":
        # Heard less than was received: the playback buffer was dropped, not played out.
        assert interrupted[0]["playedMs"] < interrupted[0]["receivedMs"], why
    freed, snapshots = result["health_after_close"]
    assert freed, f"the session outlived its page: {snapshots}"


def test_push_to_talk_over_websocket_opus(tiny_checkpoint: Path, cache_dir: Path, fake_mic_wav: Path,
                                          tmp_path: Path) -> None:
    result = run_driver("ws-opus-push-to-talk", fake_mic_wav, cache_dir, tmp_path)
    why = explain(result, tmp_path)
    assert result["connect_error"] is None and "wait_error" not in result, why
    stats = result["page"]["stats"]
    assert stats["errors"] == [], why
    # no server VAD: the turn is the button's hold, committed by hand
    assert stats["eventCounts"].get("input_audio_buffer.speech_started", 0) == 0, why
    assert stats["eventCounts"].get("input_audio_buffer.committed", 0) >= 1, why
    assert stats["responsesCompleted"] >= 1 and stats["audioSamplesPlayed"] > 0, why
    assert stats["lastLatencyMs"] is not None and stats["lastLatencyMs"] > 0, why
    freed, snapshots = result["health_after_close"]
    assert freed, f"the session outlived its page: {snapshots}"
