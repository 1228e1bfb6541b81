"""Images through the official openai client against a live server on loopback (tiny model): bad images are
refused with their code (a 400 in chat, an `error` event in realtime, the session answering on), and a good
one gets a reply, streamed or not, with its tokens counted and the vision tower's time in /metrics."""

from __future__ import annotations

import asyncio
import base64
import io
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import openai
import pytest
from openai import AsyncOpenAI
from PIL import Image

from tests.conftest import Server


def _png(width: int, height: int) -> bytes:
    y, x = np.mgrid[:height, :width]
    pixels = np.stack([x * 255 // width, y * 255 // height, (x + y) % 256], axis=2).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _data_url(raw: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(raw).decode()


PNG = _png(96, 64)
# a 70-byte PNG whose header claims 20000 x 20000 (1.2 GB of pixels)
HUGE_HEADER = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 20_000, 20_000, 8, 2, 0, 0, 0))
               + _chunk(b"IDAT", zlib.compress(b"\0" * 64)) + _chunk(b"IEND", b""))
# (image URLs, the code, where) for one bad image each, and one image too many; `where`: the part's index
BAD_IMAGES = {
    "not_an_image": ([_data_url(b"these are words, not pixels")], "invalid_image", 1),
    "truncated": ([_data_url(PNG[: len(PNG) // 2])], "invalid_image", 1),
    "too_many": ([_data_url(PNG)] * 9, "too_many_images", None),
    "remote_url": (["https://images.example.com/cat.png"], "image_url_not_allowed", 1),
    "huge_header": ([_data_url(HUGE_HEADER)], "image_too_large", 1),
}


@pytest.fixture
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def _user(*urls: str) -> list[dict[str, Any]]:
    images = [{"type": "image_url", "image_url": {"url": url, "detail": "auto"}} for url in urls]
    return [{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}, *images]}]


@pytest.mark.parametrize("case", BAD_IMAGES)
def test_chat_refuses_a_bad_image_with_its_code(client: openai.OpenAI, case: str) -> None:
    urls, code, index = BAD_IMAGES[case]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=_user(*urls), max_tokens=4)
    assert caught.value.code == code
    assert caught.value.param == ("messages" if index is None else f"messages.0.content.{index}.image_url")
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert reply.choices[0].message.content is not None


def test_chat_takes_images_in_user_messages_only(client: openai.OpenAI) -> None:
    messages = [{"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": _data_url(PNG)}}]},
                {"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=4)
    assert (caught.value.code, caught.value.param) == ("invalid_value", "messages.0.content.0.type")
    assert "role 'user'" in caught.value.message


def _count(metrics: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(name + " "))


def test_chat_answers_an_image(client: openai.OpenAI, server: Server) -> None:
    metrics = server.get("/metrics").text
    towers_before = _count(metrics, "engine_vision_tower_seconds_count")
    decoded_before = _count(metrics, "gateway_image_decode_seconds_count")
    text_only = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "What is in this picture?"}], max_tokens=4)
    reply = client.chat.completions.create(model="tiny", messages=_user(_data_url(PNG)), max_tokens=4, seed=5)
    assert reply.choices[0].message.content
    assert reply.usage.prompt_tokens_details.image_tokens > 0
    assert reply.usage.prompt_tokens > text_only.usage.prompt_tokens + reply.usage.prompt_tokens_details.image_tokens
    # the tower's time is told to /metrics, once for the step that carried the picture
    metrics = server.get("/metrics").text
    assert _count(metrics, "engine_vision_tower_seconds_count") == towers_before + 1
    assert _count(metrics, "gateway_image_decode_seconds_count") == decoded_before + 1  # the picture's decoding


def test_chat_streams_an_answer_to_an_image(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model="tiny", messages=_user(_data_url(PNG)), max_tokens=4, seed=5,
                                            stream=True, stream_options={"include_usage": True})
    text, finish_reasons, usage = "", [], None
    for chunk in stream:
        usage = chunk.usage or usage
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            if chunk.choices[0].finish_reason:
                finish_reasons.append(chunk.choices[0].finish_reason)
    one_shot = client.chat.completions.create(model="tiny", messages=_user(_data_url(PNG)), max_tokens=4, seed=5)
    assert len(finish_reasons) == 1 and text == one_shot.choices[0].message.content
    assert usage is not None and usage.prompt_tokens_details.image_tokens == \
        one_shot.usage.prompt_tokens_details.image_tokens > 0


def _realtime(server: Server) -> AsyncOpenAI:
    ws_url = server.base_url.replace("http://", "ws://") + "/v1"
    return AsyncOpenAI(base_url=server.base_url + "/v1", websocket_base_url=ws_url, api_key="unused", max_retries=0)


async def _until(conn: Any, last: str, timeout_s: float = 60) -> list[Any]:
    seen = []
    async with asyncio.timeout(timeout_s):
        async for event in conn:
            seen.append(event)
            if event.type == last:
                return seen
    raise AssertionError(f"connection closed before {last}")


def _item(*urls: str) -> dict[str, Any]:
    images = [{"type": "input_image", "image_url": url, "detail": "auto"} for url in urls]
    return {"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "What is in this picture?"}, *images]}


async def _text_session(conn: Any) -> None:
    await conn.recv()  # session.created
    await conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                       "audio": {"input": {"turn_detection": None}}})
    await _until(conn, "session.updated")


async def test_realtime_refuses_bad_images_with_error_events_and_answers_on(server: Server) -> None:
    async with _realtime(server) as client, client.realtime.connect(model="tiny") as conn:
        await _text_session(conn)
        for case, (urls, code, index) in BAD_IMAGES.items():
            await conn.conversation.item.create(item=_item(*urls), event_id=f"evt_{case}")
            events = await _until(conn, "error")
            assert not [e for e in events if e.type.startswith("conversation.item.")], case
            error = events[-1].error
            assert (error.code, error.event_id, error.type) == (code, f"evt_{case}", "invalid_request_error")
            assert error.param == ("item.content" if index is None else f"item.content.{index}.image_url")
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Still there?"}]})
        await _until(conn, "conversation.item.done")
        await conn.response.create(response={"max_output_tokens": 4})
        done = await _until(conn, "response.done")
    assert done[-1].response.status == "completed"


async def test_realtime_answers_an_item_with_an_image(server: Server) -> None:
    async with _realtime(server) as client, client.realtime.connect(model="tiny") as conn:
        await _text_session(conn)
        await conn.conversation.item.create(item=_item(_data_url(PNG)))
        added = await _until(conn, "conversation.item.done")
        await conn.response.create(response={"max_output_tokens": 4})
        done = await _until(conn, "response.done")
    item = next(e for e in added if e.type == "conversation.item.added").item
    assert [part.type for part in item.content] == ["input_image", "input_text"]
    assert item.content[0].image_url is None  # the image is not sent back
    response = done[-1].response
    assert response.status == "completed", response.status_details
    assert response.output[0].content[0].text
    assert response.usage.input_token_details.image_tokens > 0


def test_chat_answers_a_video_and_refuses_a_long_one(client: openai.OpenAI) -> None:
    """vLLM's `video_url` part: an MP4's frames, two a second, count as image tokens; one past the 30 s the server
    takes is refused from its header; its sound joins when the request asks (`use_audio_in_video`)."""
    from tests.unit.test_videos import data_url, encoded

    def ask(raw: bytes, **extra: Any) -> Any:
        return client.chat.completions.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": data_url(raw)}}, {"type": "text", "text": "What happens?"}]}],
            **extra)

    reply = ask(encoded(seconds=3.0))
    assert reply.choices[0].message.content and reply.usage.prompt_tokens_details.image_tokens > 0
    assert reply.usage.prompt_tokens_details.audio_tokens == 0
    with pytest.raises(openai.BadRequestError) as refused:
        ask(encoded(seconds=31.0, rate=2))
    assert refused.value.code == "image_too_large" and refused.value.param == "messages.0.content.0.video_url"

    # vLLM's way to ask for the video's own sound beside its frames: 3 s of it, 39 audio tokens
    with_sound = {"extra_body": {"mm_processor_kwargs": {"use_audio_in_video": True}}}
    heard = ask(encoded(seconds=3.0, sound="aac"), **with_sound)
    assert heard.usage.prompt_tokens_details.audio_tokens == 39
    assert heard.usage.prompt_tokens_details.image_tokens == reply.usage.prompt_tokens_details.image_tokens
    with pytest.raises(openai.BadRequestError) as silent:
        ask(encoded(seconds=3.0), **with_sound)
    assert silent.value.code == "invalid_video" and "no sound" in silent.value.message
