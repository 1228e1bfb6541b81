"""Hostile realtime client events over a real WebSocket: frames that are no JSON, JSON of any shape, and valid
events with parts swapped for junk. Each is answered with events (an `error` event in its shape where it is
refused), never by a closed socket: a probe after each one is answered. A second session open meanwhile
completes a turn afterwards, and the server logs no unhandled error."""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.sync.client import ClientConnection

from tests.conftest import Server
from tests.reliability.hostile import (
    ANY_TEXT,
    JSON,
    assert_a_turn_completes,
    assert_realtime_error,
    events_until,
    fuzz,
    mutated,
    open_session,
    to_json,
)

_PCM_10MS = base64.b64encode(bytes(480)).decode()
# Replies of two text tokens: a junk change that leaves an event valid costs the engine next to nothing.
EVENTS: list[dict[str, Any]] = [
    {"type": "session.update", "event_id": "evt_1", "session": {
        "type": "realtime", "instructions": "be brief", "output_modalities": ["text"], "max_output_tokens": 2,
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                            "turn_detection": {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                                               "silence_duration_ms": 200, "create_response": True}},
                  "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "ethan"}}}},
    {"type": "session.update", "session": {"modalities": ["text"], "input_audio_format": "g711_ulaw",
                                           "turn_detection": None, "temperature": 0.8,
                                           "max_response_output_tokens": "inf"}},  # beta's names
    {"type": "input_audio_buffer.append", "audio": _PCM_10MS},
    {"type": "input_audio_buffer.commit"},
    {"type": "input_audio_buffer.clear"},
    {"type": "conversation.item.create", "previous_item_id": None, "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"},
                                                       {"type": "input_audio", "audio": _PCM_10MS}]}},
    {"type": "conversation.item.truncate", "item_id": "item_1", "content_index": 0, "audio_end_ms": 10},
    {"type": "response.create", "response": {"output_modalities": ["text"], "max_output_tokens": 2,
                                             "instructions": "one word"}},
    {"type": "response.cancel", "response_id": "resp_1"},
    {"type": "output_audio_buffer.clear"},
]
TYPES = [event["type"] for event in EVENTS]
NOT_JSON = (ANY_TEXT | st.binary(max_size=200)
            | st.sampled_from(["[" * 100_000, '{"type": "session.update", "session": ' * 10_000, "\ufeff{}"]))
EVENT_OF_ANY_SHAPE = st.fixed_dictionaries({"type": st.sampled_from(TYPES) | ANY_TEXT},
                                           optional={"event_id": JSON, "session": JSON, "item": JSON, "audio": JSON,
                                                     "response": JSON, "item_id": JSON, "content_index": JSON})
_probes = itertools.count()


@pytest.fixture(scope="module")
def session(server: Server) -> Iterator[ClientConnection]:
    with open_session(server) as ws:
        ws.send(json.dumps(EVENTS[0]))
        events_until(ws, lambda e: e["type"] == "session.updated")
        yield ws


@pytest.fixture(scope="module")
def bystander(server: Server) -> Iterator[ClientConnection]:
    """A second session, open through all the fuzzing below; the last test has it take a turn."""
    with open_session(server) as ws:
        yield ws


@pytest.fixture(scope="module")
def log_start(server: Server) -> int:
    return len(server.log())


def _send(ws: ClientConnection, frame: str | bytes) -> None:
    """Sends `frame`, then a probe; every event up to the probe's answer is well formed."""
    ws.send(frame)
    probe = f"probe {next(_probes)}"
    ws.send(json.dumps({"type": "session.update", "session": {"instructions": probe}}))
    events = events_until(ws, lambda e: e["type"] == "session.updated" and e["session"]["instructions"] == probe)
    for event in events:
        assert isinstance(event.get("type"), str), event
        if event["type"] == "error":
            assert_realtime_error(event)


@fuzz(100)
@given(frame=NOT_JSON)
def test_frames_that_are_no_json(session: ClientConnection, bystander: ClientConnection, log_start: int,
                                 frame: str | bytes) -> None:
    _send(session, frame.encode("utf-8", "surrogatepass") if isinstance(frame, str) else frame)


@fuzz(100)
@given(value=JSON | EVENT_OF_ANY_SHAPE, binary=st.booleans())
def test_json_of_any_shape(session: ClientConnection, bystander: ClientConnection, log_start: int,
                           value: Any, binary: bool) -> None:
    frame = to_json(value)
    _send(session, frame if binary else frame.decode())


@fuzz(200)
@given(event=st.sampled_from(EVENTS).flatmap(lambda event: mutated(event, keep=("type",))))
def test_valid_events_with_junk_in_them(session: ClientConnection, bystander: ClientConnection, log_start: int,
                                        event: dict) -> None:
    _send(session, to_json(event).decode())


def test_the_server_and_the_sessions_are_unharmed(server: Server, session: ClientConnection,
                                                  bystander: ClientConnection, log_start: int) -> None:
    log = server.log()[log_start:]
    assert "Traceback" not in log and "unhandled error" not in log, log[-3000:]
    assert_a_turn_completes(bystander)
    session.send(json.dumps(EVENTS[0]))
    session.send(json.dumps({"type": "response.cancel"}))  # whatever the fuzzing left running
    session.send(json.dumps({"type": "input_audio_buffer.clear"}))
    _send(session, json.dumps({"type": "input_audio_buffer.clear"}))
    assert server.get("/health").json()["status"] == "ok"
