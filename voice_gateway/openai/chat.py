"""POST /v1/chat/completions: OpenAI's request in, the reply collected as one JSON object or streamed as SSE."""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time
import uuid
from collections.abc import Callable
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
    ImagePart,
    Message,
    ModelInfo,
    OutputEvent,
    RequestStream,
    SamplingParams,
    TextDelta,
    TextPart,
    ToolCall,
    VideoPart,
)
from voice_gateway.admission import Refused, admission_of
from voice_gateway.audio.wav import AudioDecodeError, decode_audio, encode_audio
from voice_gateway.config import GatewayConfig
from voice_gateway.errors import APIError, engine_error
from voice_gateway.media.images import IMAGES_NOT_SUPPORTED, TOO_MANY_IMAGES, ImageError, ImageLimits, image_from_url
from voice_gateway.media.videos import video_from_url
from voice_gateway.openai.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    ImageURLContent,
    InputAudioContent,
    TextContent,
    VideoURLContent,
)
from voice_gateway.openai.sse import AUDIO_TTL_S, FirstChunks, finish_reason, stream_chunks
from voice_gateway.openai.tool_parser import Content, ToolCallParser
from voice_gateway.openai.tools import max_calls, output_constraint, tools_of
from voice_gateway.openai.usage import chat_usage
from voice_gateway.text import MAX_CHARS_PER_TOKEN
from voice_gateway.voices import UnknownVoice, resolve_voice

log = logging.getLogger(__name__)
router = APIRouter()


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> JSONResponse | StreamingResponse:
    engine: Engine = request.app.state.engine
    try:
        admission_of(request).check_model(body.model)
    except Refused as refused:
        raise refused.as_api_error() from None
    modalities = body.modalities or ["text"]
    if modalities not in (["text"], ["text", "audio"], ["audio", "text"]):
        raise APIError(400, "modalities must be [\"text\"] or [\"text\", \"audio\"]", param="modalities")
    want_audio = "audio" in modalities
    audio_format = body.audio.format if body.audio else ("pcm16" if body.stream else "wav")
    if want_audio and body.stream and audio_format != "pcm16":
        raise APIError(400, "streamed audio is always pcm16: set audio.format to \"pcm16\"", param="audio.format")
    gateway: GatewayConfig = request.app.state.gateway
    _check_text_fits(body, engine.info.max_model_len)
    _check_images(body, gateway.images, engine.info)
    output = output_constraint(body)
    tools = tools_of(body)
    with_sound = bool(body.mm_processor_kwargs and body.mm_processor_kwargs.use_audio_in_video)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    engine_request = EngineRequest(
        request_id=request_id,
        messages=tuple([await _message(m, i, gateway, with_sound, engine.info.max_image_pixels,
                                       request.app.state.gateway_metrics.image_decode.observe)
                        for i, m in enumerate(body.messages)]),
        want_audio=want_audio,
        speaker=_speaker(body, engine.info.speakers) if want_audio else None,
        sampling=SamplingParams(
            max_tokens=body.max_completion_tokens or body.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
        ),
        tools=tools,
        output=output,
        conversation=body.prompt_cache_key or body.user,
    )
    # calls are parsed out of the text wherever the prompt offers tools
    parser = ToolCallParser(max_calls(body)) if tools else None
    try:
        stream = await engine.submit(engine_request)
    except EngineError as e:
        raise engine_error(str(e), e.code, e.retry_after_s) from e
    if body.stream:
        head = await _first_event(request, stream)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        received_at = getattr(request.state, "received_at", time.perf_counter())
        return StreamingResponse(
            stream_chunks(stream, head, body.model, want_audio, include_usage,
                          FirstChunks(received_at, request.app.state.gateway_metrics), parser),
            media_type="text/event-stream",
        )
    watcher = asyncio.create_task(_abort_on_disconnect(request, stream))
    try:
        return await _collect(stream, body.model, want_audio, audio_format, parser)
    finally:
        watcher.cancel()


async def _first_event(request: Request, stream: RequestStream) -> OutputEvent:
    """A streamed reply's first event, before its headers: a request the engine queued and then refused
    (overloaded), or one it could not start, is still an HTTP status (429 with Retry-After, 503)."""
    watcher = asyncio.create_task(_abort_on_disconnect(request, stream))
    try:
        head = await anext(stream)
    finally:
        watcher.cancel()
    if isinstance(head, Failed):
        raise engine_error(head.reason, head.code, head.retry_after_s, status=500)
    return head


async def _abort_on_disconnect(request: Request, stream: RequestStream) -> None:
    """A non-streaming client that hangs up should not keep the engine busy."""
    while not await request.is_disconnected():
        await asyncio.sleep(0.1)
    log.info("client of %s went away", stream.request_id)
    await stream.aclose()


def _speaker(body: ChatCompletionRequest, speakers: tuple[str, ...]) -> str | None:
    """The speaker `audio.voice` names (a model's own, or OpenAI's mapped onto them); None: the model's default."""
    if body.audio is None or body.audio.voice is None:
        return None
    try:
        return resolve_voice(body.audio.voice, speakers)
    except UnknownVoice as e:
        raise APIError(400, str(e), param="audio.voice") from None


def _check_text_fits(body: ChatCompletionRequest, max_model_len: int) -> None:
    chars = 0
    for message in body.messages:
        if isinstance(message.content, str):
            chars += len(message.content)
        elif message.content is not None:
            chars += sum(len(part.text) for part in message.content if isinstance(part, TextContent))
    if chars > MAX_CHARS_PER_TOKEN * max_model_len:
        raise APIError(400, f"the messages hold {chars} characters, at least {-(-chars // MAX_CHARS_PER_TOKEN)} "
                       f"tokens; this model's context is {max_model_len} tokens",
                       param="messages", code="context_length_exceeded")


def _check_images(body: ChatCompletionRequest, limits: ImageLimits, model: ModelInfo) -> None:
    """Images only for a model that takes them, in user messages, and not too many: checked before any decodes."""
    count = 0
    for i, message in enumerate(body.messages):
        for j, part in enumerate(message.content if isinstance(message.content, list) else ()):
            if not isinstance(part, ImageURLContent | VideoURLContent):
                continue
            if not model.max_image_pixels:
                raise APIError(400, f"this model ({model.model_id}) takes no images: serve one that does (tiny, or a "
                               "Qwen3-Omni checkpoint)", param=f"messages.{i}.content.{j}", code=IMAGES_NOT_SUPPORTED)
            if message.role != "user":
                raise APIError(400, f"messages.{i}.content.{j}: {part.type} parts are only for messages with role "
                               f"'user', and this message's role is '{message.role}'",
                               param=f"messages.{i}.content.{j}.type", code="invalid_value")
            count += 1
    if count > limits.max_images_per_request:
        raise APIError(400, f"the messages hold {count} images; a request may hold at most "
                       f"{limits.max_images_per_request}", param="messages", code=TOO_MANY_IMAGES)


async def _message(message: ChatMessage, index: int, gateway: GatewayConfig, with_sound: bool,
                   seen_pixels: int, decoded: Callable[[float], None]) -> Message:
    """`with_sound`: each video brings its own sound (`mm_processor_kwargs.use_audio_in_video`); `seen_pixels`: the
    most of an image the model looks at (large JPEGs decode nearer that)."""
    role = {"developer": "system"}.get(message.role, message.role)
    calls = tuple(ToolCall(c.function.name, c.function.arguments) for c in message.tool_calls or ())
    if message.content is None:
        return Message(role, (), calls)  # type: ignore[arg-type]
    if isinstance(message.content, str):
        return Message(role, (TextPart(message.content),), calls)  # type: ignore[arg-type]
    parts: list[TextPart | AudioPart | ImagePart | VideoPart] = []
    for j, part in enumerate(message.content):
        if isinstance(part, InputAudioContent):
            param = f"messages.{index}.content.{j}.input_audio"
            parts.append(AudioPart(await _decode_input_audio(part, param, gateway.max_input_audio_s)))
        elif isinstance(part, ImageURLContent):
            param = f"messages.{index}.content.{j}.image_url"
            parts.append(ImagePart(await _decode_image_url(part, param, gateway.images, seen_pixels, decoded)))
        elif isinstance(part, VideoURLContent):
            param = f"messages.{index}.content.{j}.video_url"
            try:
                parts.append(await video_from_url(part.video_url.url, gateway.videos, with_sound=with_sound))
            except ImageError as e:  # logged with the other refusals, by the error handler
                raise APIError(400, f"{param}: {e}", param=param, code=e.code) from e
        else:
            parts.append(TextPart(part.text))
    return Message(role, tuple(parts), calls)  # type: ignore[arg-type]


async def _decode_input_audio(part: InputAudioContent, param: str, max_audio_s: float) -> np.ndarray:
    try:
        raw = base64.b64decode(part.input_audio.data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise APIError(400, f"{param}.data is not valid base64", param=f"{param}.data") from e
    try:
        # decoding and resampling take CPU time in proportion to the audio's length: not on the event loop
        return await asyncio.to_thread(decode_audio, raw, part.input_audio.format,
                                       to_hz=INPUT_SAMPLE_RATE_HZ, max_seconds=max_audio_s)
    except AudioDecodeError as e:
        raise APIError(400, f"{param}: {e}", param=param, code=e.code) from e


async def _decode_image_url(part: ImageURLContent, param: str, limits: ImageLimits, seen_pixels: int,
                            decoded: Callable[[float], None]) -> np.ndarray:
    try:
        return await image_from_url(part.image_url.url, limits, seen_pixels, decoded)
    except ImageError as e:  # logged with the other refusals, by the error handler
        raise APIError(400, f"{param}: {e}", param=param, code=e.code) from e


async def _collect(stream: RequestStream, model: str, want_audio: bool, audio_format: str,
                   parser: ToolCallParser | None) -> JSONResponse:
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
                raise engine_error(event.reason, event.code, event.retry_after_s, status=500)
    finally:
        await stream.aclose()
    assert finished is not None
    transcript = "".join(text)
    message: dict[str, Any] = {"role": "assistant", "content": transcript, "refusal": None}
    if parser is not None:
        pieces = parser.feed(transcript) + parser.close()
        transcript = "".join(p.text for p in pieces if isinstance(p, Content))
        message["content"] = transcript if transcript.strip() or not parser.calls else None
        if parser.calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}} for c in parser.calls]
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
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": finish_reason(finished, bool(parser and parser.calls))}],
            "usage": chat_usage(finished),
        }
    )
