"""The demo's video control in headless Chromium against a real server: Chromium's fake camera (a moving test pattern)
or its fake shared screen goes with each spoken turn, and the reply's prompt counts the frame's image tokens.

Over a WebSocket the page sends the frame as a user item of one input_image when server VAD hears the turn start, so
the item is in the conversation before the turn's audio commits; over WebRTC the server takes the frame from the
call's video track itself. Each test runs one driver.py scenario, as test_demo.py does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.harness import explain, run_driver, unavailable_reason

_reason = unavailable_reason()
if _reason is not None:
    pytest.skip(_reason, allow_module_level=True)


def _first(wire: list[dict], match) -> int:
    """The index of the first entry of the wire log that `match` accepts (len(wire) if none does)."""
    return next((i for i, entry in enumerate(wire) if match(entry)), len(wire))


def _assert_a_turn_with_a_frame(result: dict, out_dir: Path) -> dict:
    """The reply to a turn that carried a frame completed, its prompt counted image tokens, the turn shows the
    thumbnail, and the session went with the page; the page's stats."""
    why = explain(result, out_dir)
    assert result["connect_error"] is None and "wait_error" not in result, why
    stats = result["page"]["stats"]
    assert stats["errors"] == [], why
    assert any(r["status"] == "completed" and r["imageTokens"] > 0 for r in stats["responses"]), why
    assert stats["framesWithTurns"] >= 1, why
    frames = [user["frame"] for user in result["dom"]["users"] if user["frame"]]
    assert frames, why
    # a JPEG, its long side at most 1280 px (Chromium's fake devices give 1280x720 or the 1360x766 viewport)
    assert all(f["src"] == "data:image/jpeg;base64" and 0 < max(f["width"], f["height"]) <= 1280 for f in frames), why
    assert not result["preview"]["hidden"] and result["preview"]["width"] > 0, why
    freed, snapshots = result["health_after_close"]
    assert freed, f"the session outlived its page: {snapshots}"
    return stats


def test_a_camera_frame_goes_with_a_turn_over_websocket(tiny_checkpoint: Path, cache_dir: Path, fake_mic_wav: Path,
                                                        tmp_path: Path) -> None:
    result = run_driver("ws-opus-camera", fake_mic_wav, cache_dir, tmp_path)
    stats = _assert_a_turn_with_a_frame(result, tmp_path)
    why = explain(result, tmp_path)
    wire = result["wire"]
    sent = _first(wire, lambda e: e["dir"] == "sent" and e["type"] == "conversation.item.create"
                  and e["item"]["content"] == ["input_image"])
    assert sent < len(wire) and wire[sent]["image_urls"] == ["data:image/jpeg;base64"], wire
    # The server's own order: the image item joined the conversation before the turn's audio committed, and so
    # before the reply it started.
    echoed = _first(wire, lambda e: e["type"] == "conversation.item.added" and e["item"]["content"] == ["input_image"])
    committed = _first(wire, lambda e: e["type"] == "input_audio_buffer.committed")
    created = _first(wire, lambda e: e["type"] == "response.created")
    assert sent < echoed < committed < created < len(wire), [(e["dir"], e["type"]) for e in wire[:40]]
    assert stats["userItems"][:2] == [{"id": wire[echoed]["item"]["id"], "content": ["input_image"]},
                                      {"id": wire[committed]["item_id"], "content": ["input_audio"]}], why
    # the first reply is that turn's, and its prompt held the frame
    assert stats["responses"][0]["status"] == "completed" and stats["responses"][0]["imageTokens"] > 0, why
    assert result["offer_media"] is None, why


@pytest.mark.parametrize("scenario", ["webrtc-camera", "webrtc-screen-mid-call"])
def test_a_video_frame_goes_with_a_turn_over_webrtc(tiny_checkpoint: Path, cache_dir: Path, fake_mic_wav: Path,
                                                    tmp_path: Path, scenario: str) -> None:
    """The camera on before the call, or the screen shared once it is up (swapped into the call's video sender):
    the server adds a frame of the track to the turn's audio item, as its echo on the data channel shows."""
    result = run_driver(scenario, fake_mic_wav, cache_dir, tmp_path)
    stats = _assert_a_turn_with_a_frame(result, tmp_path)
    why = explain(result, tmp_path)
    assert result["offer_media"] == {"audio": "sendrecv", "video": "sendonly", "application": ""}, why
    assert {"input_audio", "input_image"} in [set(item["content"]) for item in stats["userItems"]], why
    assert all(item["content"] != ["input_image"] for item in stats["userItems"]), why  # no item of its own
    assert not any(e["dir"] == "sent" for e in result["wire"]), why  # no WebSocket at all
