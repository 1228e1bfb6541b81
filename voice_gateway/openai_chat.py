"""POST /v1/chat/completions (JSON and SSE streaming) and GET /v1/models, in OpenAI's exact shapes."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine import (
    INPUT_SAMPLE_RATE_HZ,
    SAMPLE_RATE_HZ,
    AudioChunk,
    AudioPart,
    Engine,
    EngineError,
    EngineRequest,
    Failed,
    Finished,
    Message,
    SamplingParams,
    TextDelta,
    TextPart,
)
from voice_gateway.audio.wav import AudioDecodeError, decode_audio, encode_audio, float_to_pcm16
from voice_gateway.errors import APIError
from voice_gateway.metrics import GatewayMetrics
from voice_gateway.openai_models import ChatCompletionRequest, ChatMessage, InputAudioContent

log = logging.getLogger(__name__)
router = APIRouter()
AUDIO_TTL_S = 3600


def _engine(request: Request) -> Engine:
    return request.app.state.engine


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    info = _engine(request).info
    return {
        "object": "list",
        "data": [
            {
                "id": info.model_id,
                "object": "model",
                "created": request.app.state.started_at,
                "owned_by": "voice-gateway",
                "description": info.description,
                "random_weights": info.is_random_weights,
                "max_model_len": info.max_model_len,
                "voices": list(info.speakers),
            }
        ],
    }


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> JSONResponse | StreamingResponse:
    engine = _engine(request)
    if body.model != engine.info.model_id:
        raise APIError(
            404, f"The model `{body.model}` does not exist; this server serves `{engine.info.model_id}`.",
            param="model", code="model_not_found",
        )
    modalities = body.modalities or ["text"]
    if modalities not in (["text"], ["text", "audio"], ["audio", "text"]):
        raise APIError(400, "modalities must be [\"text\"] or [\"text\", \"audio\"]", param="modalities")
    want_audio = "audio" in modalities
    audio_format = body.audio.format if body.audio else ("pcm16" if body.stream else "wav")
    if want_audio and body.stream and audio_format != "pcm16":
        raise APIError(400, "streamed audio is always pcm16: set audio.format to \"pcm16\"", param="audio.format")
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    engine_request = EngineRequest(
        request_id=request_id,
        messages=tuple(_message(m, i) for i, m in enumerate(body.messages)),
        want_audio=want_audio,
        speaker=body.audio.voice if body.audio else None,
        sampling=SamplingParams(
            max_tokens=body.max_completion_tokens or body.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
        ),
    )
    try:
        stream = await engine.submit(engine_request)
    except EngineError as e:
        raise APIError(400, str(e), code=e.code) from e
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        received_at = getattr(request.state, "received_at", time.perf_counter())
        return StreamingResponse(
            _sse(stream, body.model, want_audio, include_usage, FirstChunks(received_at, request.app.state.gateway_metrics)),
            media_type="text/event-stream",
        )
    watcher = asyncio.create_task(_abort_on_disconnect(request, stream))
    try:
        return await _collect(stream, body.model, want_audio, audio_format)
    finally:
        watcher.cancel()


async def _abort_on_disconnect(request: Request, stream) -> None:
    """A non-streaming client that hangs up should not keep the engine busy."""
    while not await request.is_disconnected():
        await asyncio.sleep(0.1)
    log.info("client of %s went away", stream.request_id)
    await stream.aclose()


def _message(message: ChatMessage, index: int) -> Message:
    role = {"developer": "system", "tool": "user"}.get(message.role, message.role)
    if message.content is None:
        return Message(role, ())  # type: ignore[arg-type]
    if isinstance(message.content, str):
        return Message(role, (TextPart(message.content),))  # type: ignore[arg-type]
    parts: list[TextPart | AudioPart] = []
    for j, part in enumerate(message.content):
        if isinstance(part, InputAudioContent):
            parts.append(AudioPart(_decode_input_audio(part, f"messages.{index}.content.{j}.input_audio")))
        else:
            parts.append(TextPart(part.text))
    return Message(role, tuple(parts))  # type: ignore[arg-type]


def _decode_input_audio(part: InputAudioContent, param: str) -> np.ndarray:
    try:
        raw = base64.b64decode(part.input_audio.data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise APIError(400, f"{param}.data is not valid base64", param=f"{param}.data") from e
    try:
        return decode_audio(raw, part.input_audio.format, to_hz=INPUT_SAMPLE_RATE_HZ)
    except AudioDecodeError as e:
        raise APIError(400, f"{param}: {e}", param=param, code="invalid_audio") from e


def _usage(finished: Finished) -> dict[str, Any]:
    t = finished.timings
    return {
        "prompt_tokens": t.prompt_tokens,
        "completion_tokens": t.completion_tokens + t.codec_frames,
        "total_tokens": t.prompt_tokens + t.completion_tokens + t.codec_frames,
        "prompt_tokens_details": {"audio_tokens": t.prompt_audio_tokens, "cached_tokens": 0},
        # audio_tokens counts codec frames: 1920 samples (80 ms) of 24 kHz audio each
        "completion_tokens_details": {"text_tokens": t.completion_tokens, "audio_tokens": t.codec_frames},
    }


async def _collect(stream, model: str, want_audio: bool, audio_format: str) -> JSONResponse:
    text: list[str] = []
    audio: list[np.ndarray] = []
    finished: Finished | None = None
    try:
        async for event in stream:
            if isinstance(event, TextDelta):
                text.append(event.text)
            elif isinstance(event, AudioChunk):
                audio.append(event.samples)
            elif isinstance(event, Finished):
                finished = event
            elif isinstance(event, Failed):
                raise APIError(500, f"generation failed: {event.reason}", type="server_error")
    finally:
        await stream.aclose()
    assert finished is not None
    transcript = "".join(text)
    message: dict[str, Any] = {"role": "assistant", "content": transcript, "refusal": None}
    if want_audio:
        samples = np.concatenate(audio) if audio else np.zeros(0, np.float32)
        message["content"] = None
        message["audio"] = {
            "id": f"audio_{uuid.uuid4().hex}",
            "data": base64.b64encode(encode_audio(samples, SAMPLE_RATE_HZ, audio_format)).decode(),
            "expires_at": int(time.time()) + AUDIO_TTL_S,
            "transcript": transcript,
        }
    return JSONResponse(
        {
            "id": stream.request_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finished.finish_reason, "logprobs": None}],
            "usage": _usage(finished),
        }
    )


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
    """One streamed reply's `chat.completion.chunk` SSE events, as bytes.

    Every event but the delta is the same for the whole reply, so it is rendered once; an audio
    delta's base64 (JSON-safe as it is) goes in as bytes, never through the JSON encoder: a 2 s
    chunk is 256 KB of it, and the server's one event loop writes 64 replies' chunks at once.
    """

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


async def _sse(stream, model: str, want_audio: bool, include_usage: bool, first: FirstChunks) -> AsyncIterator[bytes]:
    created = int(time.time())
    audio_id = f"audio_{uuid.uuid4().hex}"
    writer = ChunkWriter(stream.request_id, model, created)
    chunk = writer.chunk

    try:
        yield chunk({"role": "assistant", "content": None if want_audio else ""})
        if want_audio:
            yield chunk({"audio": {"id": audio_id}})
        async for event in stream:
            if isinstance(event, TextDelta):
                # With audio, OpenAI streams the text as the audio's transcript.
                yield chunk({"audio": {"transcript": event.text}} if want_audio else {"content": event.text})
                first.text()  # back here once the chunk is written
            elif isinstance(event, AudioChunk):
                yield writer.audio(float_to_pcm16(event.samples), created + AUDIO_TTL_S)
                first.audio()
            elif isinstance(event, Finished):
                yield chunk({}, event.finish_reason)
                if include_usage:
                    body = {"id": stream.request_id, "object": "chat.completion.chunk", "created": created,
                            "model": model, "choices": [], "usage": _usage(event)}
                    yield f"data: {json.dumps(body)}\n\n".encode()
            elif isinstance(event, Failed):
                error = APIError(500, f"generation failed: {event.reason}", type="server_error")
                yield f"data: {json.dumps(error.body())}\n\n".encode()
        yield b"data: [DONE]\n\n"
    finally:
        # A client that went away lands here (the response task is cancelled): free the engine at once.
        await stream.aclose()
