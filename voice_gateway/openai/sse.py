"""A streamed chat reply: `chat.completion.chunk` SSE events, rendered once per reply, and its first-chunk timing."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from engine import AudioChunk, Failed, Finished, OutputEvent, RequestStream, TextDelta
from voice_gateway.audio.wav import float_to_pcm16
from voice_gateway.errors import engine_error
from voice_gateway.metrics import GatewayMetrics
from voice_gateway.openai.tool_parser import Arguments, CallStart, Content, Piece, ToolCallParser
from voice_gateway.openai.usage import chat_usage

AUDIO_TTL_S = 3600


@dataclass(slots=True)
class FirstChunks:
    """Observes the first text and the first audio chunk of one streamed reply, from its arrival."""

    received_at: float
    metrics: GatewayMetrics
    text_seen: bool = False
    audio_seen: bool = False

    def text(self) -> None:
        if not self.text_seen:
            self.text_seen = True
            self.metrics.chat_ttft.observe(time.perf_counter() - self.received_at)

    def audio(self) -> None:
        if not self.audio_seen:
            self.audio_seen = True
            self.metrics.chat_ttfp.observe(time.perf_counter() - self.received_at)


class ChunkWriter:
    """One streamed reply's `chat.completion.chunk` SSE events, as bytes. Every event but the delta is the same for the
    whole reply, so it is rendered once; an audio delta's base64 goes in as bytes, never through the JSON encoder,
    since the server's one event loop writes many replies' audio at once."""

    def __init__(self, request_id: str, model: str, created: int) -> None:
        envelope = json.dumps({"id": request_id, "object": "chat.completion.chunk", "created": created,
                               "model": model}, separators=(",", ":"))
        self._head = f'data: {envelope[:-1]},"choices":[{{"index":0,"delta":'.encode()

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        tail = json.dumps({"finish_reason": finish_reason, "logprobs": None}, separators=(",", ":"))
        return b"".join((self._head, json.dumps(delta, separators=(",", ":")).encode(), b",", tail[1:].encode(),
                         b"]}\n\n"))

    def audio(self, pcm16: bytes, expires_at: int) -> bytes:
        return b"".join((self._head, b'{"audio":{"data":"', base64.b64encode(pcm16), b'","expires_at":',
                         str(expires_at).encode(), b'}},"finish_reason":null,"logprobs":null}]}\n\n'))


def finish_reason(finished: Finished, made_calls: bool) -> str:
    """OpenAI's finish reason: a reply that called tools and ended by itself ends in "tool_calls"."""
    return "tool_calls" if made_calls and finished.finish_reason == "stop" else finished.finish_reason


def _delta(piece: Piece, want_audio: bool) -> dict[str, Any]:
    if isinstance(piece, Content):
        # With audio, OpenAI streams the text as the audio's transcript.
        return {"audio": {"transcript": piece.text}} if want_audio else {"content": piece.text}
    if isinstance(piece, CallStart):
        call = {"index": piece.index, "id": piece.id, "type": "function",
                "function": {"name": piece.name, "arguments": ""}}
    else:
        assert isinstance(piece, Arguments)
        call = {"index": piece.index, "function": {"arguments": piece.text}}
    return {"tool_calls": [call]}


async def _events(head: OutputEvent, stream: RequestStream) -> AsyncIterator[OutputEvent]:
    yield head
    async for event in stream:
        yield event


async def stream_chunks(stream: RequestStream, head: OutputEvent, model: str, want_audio: bool, include_usage: bool,
                        first: FirstChunks, parser: ToolCallParser | None = None) -> AsyncIterator[bytes]:
    """The reply's SSE events from its first engine event `head` on, `data: [DONE]` last; the engine
    request is closed however the stream ends. `parser`: where the prompt offers tools, the text's
    tool calls go out as `tool_calls` deltas."""
    created = int(time.time())
    audio_id = f"audio_{uuid.uuid4().hex}"
    writer = ChunkWriter(stream.request_id, model, created)
    chunk = writer.chunk

    try:
        yield chunk({"role": "assistant", "content": None if want_audio else ""})
        if want_audio:
            yield chunk({"audio": {"id": audio_id}})
        async for event in _events(head, stream):
            if isinstance(event, TextDelta):
                pieces: list[Piece] = [Content(event.text)] if parser is None else parser.feed(event.text)
                for piece in pieces:
                    yield chunk(_delta(piece, want_audio))
                    first.text()  # back here once the chunk is written
            elif isinstance(event, AudioChunk):
                yield writer.audio(float_to_pcm16(event.samples), created + AUDIO_TTL_S)
                first.audio()
            elif isinstance(event, Finished):
                for piece in parser.close() if parser is not None else ():
                    yield chunk(_delta(piece, want_audio))
                yield chunk({}, finish_reason(event, bool(parser and parser.calls)))
                if include_usage:
                    body = {"id": stream.request_id, "object": "chat.completion.chunk", "created": created,
                            "model": model, "choices": [], "usage": chat_usage(event)}
                    yield f"data: {json.dumps(body)}\n\n".encode()
            elif isinstance(event, Failed):
                error = engine_error(event.reason, event.code, event.retry_after_s, status=500)
                yield f"data: {json.dumps(error.body())}\n\n".encode()
        yield b"data: [DONE]\n\n"
    finally:
        # A client that went away lands here (the response task is cancelled): free the engine at once.
        await stream.aclose()
