"""Hostile input at the HTTP and WebSocket edge: clear 4xx refusals, found before any expensive work."""

from __future__ import annotations

import base64
import io
import json
import struct
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from starlette.testclient import TestClient

from engine import create_engine, load_profile
from voice_gateway.app import create_app
from voice_gateway.audio import wav
from voice_gateway.audio.resample import resample
from voice_gateway.config import GatewayConfig

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_AUDIO_S = 5.0


@pytest.fixture(scope="module")
def client(tiny_checkpoint: Path, cache_dir: Path) -> Iterator[TestClient]:
    engine = create_engine("tiny", load_profile(model="tiny", platform="cpu"), cache_dir)
    # TestClient sends `Host: testserver`, which the realtime endpoints take only when named
    gateway = GatewayConfig(max_body_bytes=MAX_BODY_BYTES, max_input_audio_s=MAX_AUDIO_S, allowed_hosts=("testserver",))
    with TestClient(create_app(engine, gateway)) as client:
        yield client


def _chat(client: TestClient, **fields: object) -> dict:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}
    return client.post("/v1/chat/completions", json=body).json()


def _audio_message(data: bytes, fmt: str = "wav") -> list[dict]:
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}
    return [{"role": "user", "content": [{"type": "text", "text": "listen"}, part]}]


def _wav_header(sample_rate_hz: int, data_bytes: int) -> bytes:
    """A mono PCM16 WAV header whose fields say what we like, followed by `data_bytes` of zeros."""
    fmt = struct.pack("<HHIIHH", 1, 1, sample_rate_hz, sample_rate_hz * 2, 2, 16)
    return (b"RIFF" + struct.pack("<I", 36 + data_bytes) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
            + b"data" + struct.pack("<I", data_bytes) + bytes(data_bytes))


def _refused(reply: dict) -> tuple[str | None, str | None]:
    assert "error" in reply, reply
    return reply["error"]["code"], reply["error"]["param"]


def test_a_1_hz_wav_is_refused_from_its_header_before_any_decode(
        client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_decode(*args: object, **kwargs: object) -> np.ndarray:
        raise AssertionError("resampled audio the header should have refused")
    monkeypatch.setattr(wav, "resample", no_decode)
    start = time.perf_counter()
    reply = client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": _audio_message(_wav_header(1, 300_000))})
    assert time.perf_counter() - start < 1.0
    assert reply.status_code == 400
    assert _refused(reply.json()) == ("invalid_audio", "messages.0.content.1.input_audio")
    assert "1 Hz" in reply.json()["error"]["message"]


def test_audio_longer_than_the_limit_is_refused_from_its_header(
        client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wav, "resample", lambda *a, **k: pytest.fail("decoded audio over the limit"))
    reply = _chat(client, messages=_audio_message(_wav_header(8_000, 2 * 8_000 * 6)))
    assert _refused(reply) == ("audio_too_long", "messages.0.content.1.input_audio")
    pcm = _chat(client, messages=_audio_message(bytes(2 * 24_000 * 6), "pcm16"))
    assert _refused(pcm)[0] == "audio_too_long"


def test_many_channels_at_a_high_rate_decode_in_bounded_memory() -> None:
    """A few hundred KB of 8-channel 96 kHz FLAC silence is 2 minutes of audio: 368 MB as float32 if
    decoded whole. It is decoded a second at a time and mixed down at once."""
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", 96_000, 8, format="FLAC", subtype="PCM_16") as f:
        for _ in range(120):
            f.write(np.zeros((96_000, 8), np.float32))
    assert len(buf.getvalue()) < 200_000
    tracemalloc.start()
    try:
        samples = wav.decode_audio(buf.getvalue(), "flac", to_hz=16_000, max_seconds=600)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert samples.shape == (120 * 16_000,)
    assert peak < 40e6, f"decoding took {peak / 1e6:.0f} MB"  # the output is 7.7 MB, a block 3 MB


def test_decoding_in_blocks_equals_decoding_whole() -> None:
    stereo = np.random.default_rng(0).standard_normal((48_000 * 3 + 123, 2)).astype(np.float32) * 0.1
    buf = io.BytesIO()
    sf.write(buf, stereo, 48_000, format="WAV", subtype="FLOAT")
    decoded = wav.decode_audio(buf.getvalue(), "wav", to_hz=16_000, max_seconds=600)
    np.testing.assert_allclose(decoded, resample(stereo.mean(axis=1), 48_000, 16_000), atol=1e-6)


def test_undecodable_audio_says_why_without_a_memory_address(client: TestClient) -> None:
    reply = _chat(client, messages=_audio_message(b"not audio at all", "wav"))
    assert _refused(reply) == ("invalid_audio", "messages.0.content.1.input_audio")
    assert "0x" not in reply["error"]["message"] and "BytesIO" not in reply["error"]["message"]


def test_valid_audio_still_gets_a_reply(client: TestClient) -> None:
    buf = io.BytesIO()
    t = np.arange(16_000) / 16_000
    sf.write(buf, 0.3 * np.sin(2 * np.pi * 220 * t), 16_000, format="WAV", subtype="PCM_16")
    reply = _chat(client, messages=_audio_message(buf.getvalue()))
    assert reply["object"] == "chat.completion", reply


def test_a_body_over_the_limit_gets_413(client: TestClient) -> None:
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x" * MAX_BODY_BYTES}]})
    reply = client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 413
    assert reply.json() == {"error": {"message": f"the request body is larger than {MAX_BODY_BYTES} bytes",
                                      "type": "invalid_request_error", "param": None, "code": "request_too_large"}}

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted while read
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b" " * 65536
    streamed = client.post("/v1/chat/completions", content=chunked(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413 and streamed.json()["error"]["code"] == "request_too_large"
    assert client.get("/health").status_code == 200


def test_a_huge_prompt_is_refused_without_tokenizing(client: TestClient) -> None:
    start = time.perf_counter()
    reply = client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "word " * 1_000_000}]})
    assert time.perf_counter() - start < 2.0
    assert reply.status_code == 400
    assert _refused(reply.json()) == ("context_length_exceeded", "messages")


def _post(client: TestClient, body: dict) -> tuple[int, dict]:
    # json.dumps escapes a lone surrogate as \ud800: what a hostile client sends
    reply = client.post("/v1/chat/completions", content=json.dumps(body), headers={"content-type": "application/json"})
    return reply.status_code, reply.json()


@pytest.mark.parametrize(("change", "param"), [
    ({"messages": [{"role": "user", "content": "a\ud800b"}]}, "messages.0.content"),
    ({"messages": [{"role": "system", "content": "\udfff"}, {"role": "user", "content": "hi"}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "nul\x00"}]}]}, "messages.0.content.0.text"),
    ({"model": "tiny\ud800"}, "model"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "\ud800", "format": "wav"}}, "audio.voice"),
])
def test_lone_surrogates_and_nul_are_a_400(client: TestClient, change: dict, param: str) -> None:
    status, reply = _post(client, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **change})
    assert status == 400, reply
    assert _refused(reply) == ("invalid_value", param)


def test_an_error_that_quotes_a_surrogate_still_encodes(client: TestClient) -> None:
    status, reply = _post(client, {"model": "tiny", "messages": [{"role": "user", "content": [
        {"type": "\ud800", "text": "x"}]}]})
    assert status == 400 and reply["error"]["param"] == "messages.0.content.0", reply


@pytest.mark.parametrize(("change", "param"), [
    ({"stream": "yes"}, "stream"),
    ({"max_tokens": "4"}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_completion_tokens": "4"}, "max_completion_tokens"),
    ({"n": "1"}, "n"),
    ({"temperature": "0.5"}, "temperature"),
    ({"seed": 1.5}, "seed"),
    ({"stream_options": {"include_usage": "yes"}, "stream": True}, "stream_options.include_usage"),
    ({"modalities": []}, "modalities"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "", "format": "wav"}}, "audio.voice"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                {"type": "input_audio", "input_audio": {"data": 5}}]}]},
     "messages.0.content.1.input_audio.data"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content.0.text"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages.0.content.0.image_url"),
    ({"messages": [{"role": "user", "content": [{"type": "input_image"}]}]}, "messages.0.content.0"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
])
def test_loose_types_are_refused_where_openai_refuses_them(client: TestClient, change: dict, param: str) -> None:
    status, reply = _post(client, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **change})
    assert status == 400, reply
    assert _refused(reply) == ("invalid_value", param)


def test_the_shapes_openai_clients_send_still_work(client: TestClient) -> None:
    status, reply = _post(client, {"model": "tiny", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}]}], "max_tokens": 2, "temperature": 1, "top_p": 0.9, "n": 1, "seed": 3,
        "stream": False, "modalities": ["text"]})
    assert status == 200, reply


def _events_until(ws: object, wanted: str) -> list[dict]:
    events = []
    while True:
        event = json.loads(ws.receive_text())  # type: ignore[attr-defined]
        events.append(event)
        if event["type"] == wanted:
            return events


@pytest.mark.parametrize("event", [
    {"type": "session.update", "session": {"instructions": "be \ud800 brief"}},
    {"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "\ud83d"}]}},
    {"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "a\x00"}]}},
    {"type": "response.create", "response": {"instructions": "\udc00"}},
    {"type": "session.update", "event_id": "\ud800", "session": {"temperature": -5}},
    {"type": "session.update", "session": {"temperature": 1e308}},
    {"type": "session.update", "session": {"temperature": "1"}},
    {"type": "session.update", "session": {"voice": ""}},
])
def test_realtime_bad_text_is_an_error_event_and_the_session_answers_on(client: TestClient, event: dict) -> None:
    with client.websocket_connect("/v1/realtime") as ws:
        assert json.loads(ws.receive_text())["type"] == "session.created"
        ws.send_text(json.dumps(event))
        error = _events_until(ws, "error")[-1]["error"]
        assert error["code"] == "invalid_value", error
        ws.send_text(json.dumps({"type": "session.update", "session": {"instructions": "be brief",
                                                                        "temperature": 0.8}}))
        # a rejected setting rejects only itself: its update's other settings answer with session.updated first
        while (updated := _events_until(ws, "session.updated")[-1])["session"]["instructions"] != "be brief":
            assert updated["session"]["instructions"] != "be \ud800 brief"


async def test_a_send_that_fails_closes_the_session_with_1011() -> None:
    from voice_gateway.realtime import ws as realtime_ws
    from voice_gateway.realtime.outbox import Outbox

    class BrokenSocket:
        closed_with: int | None = None

        async def send_text(self, text: str) -> None:
            text.encode("utf-8")  # what the server's WebSocket does with it

        async def send_bytes(self, data: bytes) -> None:
            pass

        async def close(self, code: int = 1000, reason: str | None = None) -> None:
            self.closed_with = code

    class OneSession:
        id = "sess_test"
        outbox = Outbox(16)

    OneSession.outbox.put("\ud800")
    socket = BrokenSocket()
    await realtime_ws._write(socket, OneSession())  # type: ignore[arg-type]
    assert socket.closed_with == 1011


HUGE_TEXT = "word " * 30_000  # 150,000 characters: more than the tiny model's 1024 tokens can hold at 128 a token


@pytest.mark.parametrize(("event", "param"), [
    ({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "hello "}, {"type": "input_text", "text": HUGE_TEXT}]}}, "item.content"),
    ({"type": "session.update", "session": {"instructions": HUGE_TEXT}}, "session.instructions"),
    ({"type": "response.create", "response": {"instructions": HUGE_TEXT}}, "response.instructions"),
])
def test_realtime_text_that_cannot_fit_the_context_is_refused_before_tokenizing(
        client: TestClient, event: dict, param: str) -> None:
    with client.websocket_connect("/v1/realtime") as ws:
        assert json.loads(ws.receive_text())["type"] == "session.created"
        ws.send_text(json.dumps({"event_id": "evt_huge", **event}))
        # the session answers on: a small item after the refused event is added
        ws.send_text(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}}))
        events = []
        while not events or events[-1]["type"] != "conversation.item.added":
            events.append(json.loads(ws.receive_text()))
        assert events[-1]["item"]["content"][0]["text"] == "hi", events[-1]
        # a refused session setting leaves the rest of its update, answered with session.updated
        assert [e["type"] for e in events if e["type"] != "session.updated"] == ["error", "conversation.item.added"]
        error = events[0]["error"]
        assert (error["code"], error["param"], error["event_id"]) == ("context_length_exceeded", param, "evt_huge")
        assert "characters" in error["message"] and "context is 1024 tokens" in error["message"], error


def test_a_body_that_is_not_json_names_no_field(client: TestClient) -> None:
    reply = client.post("/v1/chat/completions", content=b'{"model": "tiny",,}',
                        headers={"content-type": "application/json"})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["code"] == "invalid_json" and error["param"] is None and "byte" in error["message"], error
