"""The streamed chat chunks as bytes (`ChunkWriter`) are the JSON of the OpenAI chunk objects they stand for."""

from __future__ import annotations

import base64
import json

import numpy as np

from voice_gateway.audio.wav import float_to_pcm16
from voice_gateway.openai.sse import ChunkWriter


def _event(raw: bytes) -> dict:
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n") and raw.count(b"\n") == 2
    return json.loads(raw[len(b"data: "):])


def test_chunks_are_the_openai_objects() -> None:
    writer = ChunkWriter("chatcmpl-1", 'model "quoted"', 1700000000)
    envelope = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": 'model "quoted"'}
    for delta, finish in (({"role": "assistant", "content": None}, None), ({"audio": {"transcript": 'a "b"\n'}}, None),
                          ({}, "stop")):
        assert _event(writer.chunk(delta, finish)) == {
            **envelope, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}
    samples = np.sin(np.arange(4000, dtype=np.float32) / 7)
    audio = _event(writer.audio(float_to_pcm16(samples), 1700003600))
    assert audio == {**envelope, "choices": [{"index": 0, "finish_reason": None, "logprobs": None, "delta": {
        "audio": {"data": base64.b64encode(float_to_pcm16(samples)).decode(), "expires_at": 1700003600}}}]}
