"""Hostile POST /v1/chat/completions bodies against the real server: bytes that are no JSON, JSON of any shape,
and valid requests with parts swapped for junk (wrong types, huge numbers, lone surrogates, nested junk).
Every answer is a 2xx or a 4xx in OpenAI's error shape; the server logs no unhandled error, stays healthy, and a
realtime session open meanwhile completes a turn afterwards."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf
from hypothesis import given
from hypothesis import strategies as st
from websockets.sync.client import ClientConnection

from tests.conftest import Server
from tests.reliability.hostile import (
    ANY_TEXT,
    JSON,
    assert_a_turn_completes,
    assert_openai_error,
    fuzz,
    huge_number_json,
    mutated,
    open_session,
    to_json,
)


def _wav_b64(seconds: float = 0.1, rate_hz: int = 16_000) -> str:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(int(seconds * rate_hz), np.float32), rate_hz, format="WAV", subtype="PCM_16")
    return base64.b64encode(buf.getvalue()).decode()


# One token of text: a junk change that happens to leave the request valid costs the engine next to nothing.
TEXT_BODY = {"model": "tiny", "messages": [{"role": "system", "content": "be brief"},
                                           {"role": "user", "content": "hi"}], "max_tokens": 1,
             "temperature": 0.7, "top_p": 0.9, "seed": 1, "n": 1, "modalities": ["text"]}
PARTS_BODY = {"model": "tiny", "stream": True, "stream_options": {"include_usage": True}, "max_completion_tokens": 1,
              "messages": [{"role": "user", "content": [{"type": "text", "text": "listen"}, {
                  "type": "input_audio", "input_audio": {"data": _wav_b64(), "format": "wav"}}]}],
              "audio": {"voice": "ethan", "format": "pcm16"}}
CONTENT_TYPES = st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain",
                                 "application/x-www-form-urlencoded", "application/merge-patch+json", ""])
NOT_JSON = (st.binary(max_size=300)
            | ANY_TEXT.map(lambda text: text.encode("utf-8", "surrogatepass"))
            | st.integers(1, len(to_json(TEXT_BODY)) - 1).map(lambda n: to_json(TEXT_BODY)[:n])  # cut short
            | st.sampled_from([b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
                               b'{"model": "tiny", "model": 5}', b"\xef\xbb\xbf{}", b"\x00" * 64])
            | st.sampled_from(sorted(TEXT_BODY)).flatmap(lambda key: huge_number_json(TEXT_BODY, key)))


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def bystander(server: Server) -> Iterator[ClientConnection]:
    """A realtime session open through all the fuzzing below; the last test has it take a turn."""
    with open_session(server) as ws:
        yield ws


@pytest.fixture(scope="module")
def log_start(server: Server) -> int:
    return len(server.log())


def _post(client: httpx.Client, body: bytes, content_type: str = "application/json") -> None:
    headers = {"content-type": content_type} if content_type else {}
    reply = client.post("/v1/chat/completions", content=body, headers=headers)
    assert reply.status_code < 500, (reply.status_code, reply.text[:500])
    if reply.status_code >= 400:
        assert_openai_error(reply.json())
    elif reply.headers["content-type"].startswith("text/event-stream"):
        data = [line[6:] for line in reply.text.splitlines() if line.startswith("data: ")]
        assert data[-1] == "[DONE]", data[-3:]
        for chunk in map(json.loads, data[:-1]):
            if "error" in chunk:
                assert_openai_error(chunk)
            else:
                assert chunk["object"] == "chat.completion.chunk", chunk
    else:
        assert reply.json()["object"] == "chat.completion", reply.text[:500]


@fuzz(100)
@given(body=NOT_JSON, content_type=CONTENT_TYPES)
def test_bytes_that_are_no_json(client: httpx.Client, bystander: ClientConnection, log_start: int,
                                body: bytes, content_type: str) -> None:
    _post(client, body, content_type)


@fuzz(100)
@given(value=JSON)
def test_json_of_any_shape(client: httpx.Client, bystander: ClientConnection, log_start: int, value: Any) -> None:
    _post(client, to_json(value))


@fuzz(150)
@given(body=mutated(TEXT_BODY))
def test_a_text_request_with_junk_in_it(client: httpx.Client, bystander: ClientConnection, log_start: int,
                                        body: dict) -> None:
    _post(client, to_json(body))


@fuzz(100)
@given(body=mutated(PARTS_BODY))
def test_a_streamed_audio_request_with_junk_in_it(client: httpx.Client, bystander: ClientConnection, log_start: int,
                                                  body: dict) -> None:
    _post(client, to_json(body))


def test_the_server_and_a_bystander_session_are_unharmed(server: Server, client: httpx.Client,
                                                         bystander: ClientConnection, log_start: int) -> None:
    log = server.log()[log_start:]
    assert "Traceback" not in log and "unhandled error" not in log, log[-3000:]
    assert_a_turn_completes(bystander)
    reply = client.post("/v1/chat/completions", json={"model": "tiny", "max_tokens": 2,
                                                      "messages": [{"role": "user", "content": "hi"}]})
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] is not None
    assert client.get("/health").json()["status"] == "ok"
