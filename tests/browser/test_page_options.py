"""The demo page's URL options in headless Chromium against a real server.

The trust-carrying ones (web/page-options.js): `?key=` must leave the address bar at once and live on in this tab's
sessionStorage; a `?server=` of another origin must be confirmed before the page talks to it. The session's:
`?tool_choice=set_lamp` makes the tiny model call the page's lamp, which the page runs and answers; `?transcribe=1`
puts the user's words in the transcript. Each test runs one driver.py scenario, as test_demo.py does.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.browser.harness import explain, run_driver, unavailable_reason

_reason = unavailable_reason()
if _reason is not None:
    pytest.skip(_reason, allow_module_level=True)


def test_a_key_in_the_url_moves_to_session_storage(tiny_checkpoint: Path, cache_dir: Path, fake_mic_wav: Path,
                                                   tmp_path: Path) -> None:
    result = run_driver("key-in-url", fake_mic_wav, cache_dir, tmp_path)
    why = explain(result, tmp_path)
    key = result["key"]
    loaded, reloaded = result["loaded"], result["reloaded"]
    assert key not in loaded["href"] and "key=" not in loaded["href"], why
    assert loaded["stored_key"] == key, why
    # /v1/models and the realtime WebSocket both want the key on this server
    assert loaded["model"] and loaded["connect_error"] is None and loaded["session_id"], why
    assert "key=" not in reloaded["href"], why
    assert reloaded["model"] and reloaded["connect_error"] is None and reloaded["session_id"], why
    # the control: a tab without the key is refused, so the two above did send it
    assert result["keyless"]["model"] is None and any("401" in e for e in result["keyless"]["errors"]), why
    # Only the first page load's request line carries the key; the reload's does not.
    log_lines = [line for line in (tmp_path / "server.log").read_text().splitlines() if key in line]
    assert len(log_lines) == 1 and f"GET /?key={key}&" in log_lines[0], log_lines


def test_another_server_in_the_url_is_confirmed_first(tiny_checkpoint: Path, cache_dir: Path, fake_mic_wav: Path,
                                                      tmp_path: Path) -> None:
    result = run_driver("server-elsewhere", fake_mic_wav, cache_dir, tmp_path)
    why = explain(result, tmp_path)
    own, elsewhere = urlsplit(result["url"]).netloc, urlsplit(result["elsewhere"]).netloc
    dismissed, accepted = result["dismissed"], result["accepted"]
    for seen in (dismissed, accepted):
        assert len(seen["dialogs"]) == 1 and result["elsewhere"] in seen["dialogs"][0], (seen["dialogs"], why)

    # dismissed: the page's own origin, for HTTP and the session's WebSocket, and nothing sent elsewhere
    assert {urlsplit(u).netloc for u in dismissed["requests"] + dismissed["websockets"]} == {own}, (dismissed, why)
    assert dismissed["model"] and dismissed["connect_error"] is None and dismissed["session_id"], why
    assert dismissed["websockets"], why

    # accepted: the page asks the other origin (where nothing listens) for its model
    asked = [u for u in accepted["requests"] if urlsplit(u).netloc == elsewhere]
    assert any(urlsplit(u).path == "/v1/models" for u in asked), (accepted, why)
    assert accepted["model"] is None and any("cannot reach the server" in e for e in accepted["errors"]), why


def test_a_forced_tool_choice_draws_the_lamp_and_answers(tiny_checkpoint: Path, cache_dir: Path,
                                                          two_response_wav: Path, tmp_path: Path) -> None:
    result = run_driver("ws-opus-tool-call", two_response_wav, cache_dir, tmp_path)
    why = explain(result, tmp_path)
    assert result["connect_error"] is None and "wait_error" not in result, why
    stats, dom, sent = result["page"]["stats"], result["dom"], result["sent"]
    assert stats["errors"] == [] and "error" not in stats["eventCounts"], why
    assert stats["session"]["tools"] == ["set_lamp"], why
    assert stats["session"]["toolChoice"] == {"type": "function", "name": "set_lamp"}, why
    assert stats["session"]["transcription"] is None, why

    # the call the server wrote, run by the page: the lamp drawn as its argument says, the call shown
    call = stats["calls"][0]
    assert call["name"] == "set_lamp" and call["status"] == "completed", why
    on = json.loads(call["arguments"])["on"]
    assert dom["lamp"]["call"] == call["callId"], why
    assert dom["lamp"]["on"] == str(on).lower() and dom["lamp"]["label"] == ("on" if on else "off"), why
    shown = dom["calls"][0]
    assert shown["status"] == "completed" and "set_lamp" in shown["text"], why
    assert ('"lamp":"on"' if on else '"lamp":"off"') in shown["text"], why

    # its output went back under the call's id, then the ask for an answer that may use no tool
    types = [e["type"] for e in sent]
    output_at = next(i for i, e in enumerate(sent) if e["type"] == "conversation.item.create"
                     and e["item"]["type"] == "function_call_output")
    output = sent[output_at]["item"]
    assert output["call_id"] == call["callId"] and json.loads(output["output"]) == {"lamp": "on" if on else "off"}
    follow_up = next(e for e in sent[output_at:] if e["type"] == "response.create")
    assert follow_up["response"] == {"tool_choice": "none"}, types
    # the calling response held the call alone; the answer after it, words and no call
    outputs = stats["responseOutputs"]
    called = outputs.index(["function_call"])
    assert outputs[called + 1] == ["message"], outputs
    answer = result["page"]["replies"][0]
    assert answer["status"] == "completed" and answer["text"], why
    freed, snapshots = result["health_after_close"]
    assert freed, f"the session outlived its page: {snapshots}"


def test_transcription_puts_the_users_words_in_the_transcript(tiny_checkpoint: Path, cache_dir: Path,
                                                               two_response_wav: Path, tmp_path: Path) -> None:
    """The transcript and the reply share the Thinker: the long pause lets both finish before the next turn."""
    result = run_driver("webrtc-transcription", two_response_wav, cache_dir, tmp_path)
    why = explain(result, tmp_path)
    assert result["connect_error"] is None and "wait_error" not in result, why
    stats, dom = result["page"]["stats"], result["dom"]
    assert stats["errors"] == [] and "error" not in stats["eventCounts"], why
    assert stats["session"]["transcription"] is not None, why
    assert stats["session"]["toolChoice"] == "auto" and stats["session"]["tools"] == ["set_lamp"], why
    assert "conversation.item.input_audio_transcription.failed" not in stats["eventCounts"], why
    # the first turn's line holds its item's words, and its length moved to the meta line
    transcript = next(iter(stats["transcripts"].values()))
    assert transcript.strip(), why
    user = dom["users"][0]
    assert user["transcription"] == "completed" and user["text"] == transcript, why
    assert user["meta"].startswith("speech, "), why
    freed, snapshots = result["health_after_close"]
    assert freed, f"the session outlived its page: {snapshots}"
