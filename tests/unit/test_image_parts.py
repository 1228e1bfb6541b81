"""Images in the protocols: chat's `image_url` parts and realtime's `input_image` parts parsed, a realtime
item's images decoded into the conversation and echoed without their data, and the conversation's images kept
within their bounds; usage counts image tokens. No engine: the session's parts work on their own."""

from __future__ import annotations

import base64
import io
import json
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
from openai.types import realtime as ga
from PIL import Image
from pydantic import TypeAdapter, ValidationError

from engine import Engine, Finished, ImagePart, ModelInfo, Timings
from voice_gateway.media.images import ImageLimits
from voice_gateway.metrics import GatewayMetrics
from voice_gateway.openai.schemas import ChatCompletionRequest, ImageURLContent
from voice_gateway.openai.usage import chat_usage
from voice_gateway.realtime import events as ev
from voice_gateway.realtime import item_events
from voice_gateway.realtime.checks import RequestChecks
from voice_gateway.realtime.client_items import ClientItemReader
from voice_gateway.realtime.conversation import Conversation, Item, prompt_messages
from voice_gateway.realtime.conversation_items import ConversationItems
from voice_gateway.realtime.item_shapes import protocol_item
from voice_gateway.realtime.outbox import Outbox
from voice_gateway.realtime.reporter import ErrorReporter
from voice_gateway.realtime.response import _usage
from voice_gateway.realtime.sender import EventSender
from voice_gateway.realtime.settings import SessionSettings
from voice_gateway.realtime.transcription import Transcriber

INFO = ModelInfo(model_id="tiny", is_random_weights=True, description="", max_model_len=4096, speakers=("ethan",),
                 codec_frame_samples=1920, temperature=0.7, max_image_pixels=400 * 32 * 32)
PIXELS = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
LIMITS = ImageLimits()


def _png(pixels: np.ndarray = PIXELS) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def _data_url(raw: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def _chat(content: list[dict[str, Any]], role: str = "user") -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "tiny", "messages": [{"role": role, "content": content}]})


def test_chat_takes_openai_s_image_url_part() -> None:
    request = _chat([{"type": "text", "text": "what is this?"},
                     {"type": "image_url", "image_url": {"url": _data_url(_png()), "detail": "low"}},
                     {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}])
    content = request.messages[0].content
    assert isinstance(content, list)
    images = [part for part in content if isinstance(part, ImageURLContent)]
    assert [(p.image_url.url.split(",")[0], p.image_url.detail) for p in images] == [
        ("data:image/png;base64", "low"), ("https://example.com/a.png", "auto")]


@pytest.mark.parametrize("part, in_message", [
    ({"type": "image_url", "image_url": {"url": "x", "detail": "medium"}}, "'auto', 'low' or 'high'"),
    ({"type": "image_url", "image_url": "https://example.com/a.png"}, "valid dictionary"),  # Responses' shape
    ({"type": "image_url"}, "Field required"),
    ({"type": "input_image", "image_url": "x"}, "'text', 'image_url', 'input_audio' or 'video_url'"),
])
def test_chat_refuses_image_parts_of_other_shapes(part: dict[str, Any], in_message: str) -> None:
    with pytest.raises(ValidationError, match=in_message):
        _chat([part])


def test_chat_usage_counts_image_tokens() -> None:
    timings = Timings(ttft_s=0.1, ttfp_s=None, total_s=0.2, prompt_tokens=500, prompt_audio_tokens=13,
                      completion_tokens=4, codec_frames=0, audio_samples=0, cached_tokens=6, prompt_image_tokens=402)
    usage = chat_usage(Finished("r", "stop", timings))
    assert usage["prompt_tokens_details"] == {"audio_tokens": 13, "image_tokens": 402, "cached_tokens": 6}


def test_realtime_usage_counts_image_tokens_in_ga_only() -> None:
    timings = Timings(ttft_s=0.1, ttfp_s=None, total_s=0.2, prompt_tokens=500, prompt_audio_tokens=13,
                      completion_tokens=4, codec_frames=8, audio_samples=0, prompt_image_tokens=402)
    usage = _usage(timings)
    assert (usage.input_token_details.image_tokens, usage.input_token_details.text_tokens) == (402, 500 - 13 - 402)
    done = ev.ResponseDone(response=ev.RealtimeResponse(id="resp_1", status="completed", usage=usage))
    ga_details = json.loads(ev.serialize(done, ev.Dialect.GA) or "")["response"]["usage"]["input_token_details"]
    beta_details = json.loads(ev.serialize(done, ev.Dialect.BETA) or "")["response"]["usage"]["input_token_details"]
    assert ga_details["image_tokens"] == 402 and "image_tokens" not in beta_details


def _create(*content: dict[str, Any], role: str = "user", item_id: str = "img", event_id: str = "evt_1") -> str:
    return json.dumps({"type": "conversation.item.create", "event_id": event_id,
                       "item": {"id": item_id, "type": "message", "role": role, "content": list(content)}})


def test_realtime_parses_the_ga_input_image_part() -> None:
    event = ev.parse_client_event(_create({"type": "input_image", "image_url": "data:image/png;base64,AAAA",
                                           "detail": "high"}))
    assert isinstance(event, ev.ConversationItemCreate) and isinstance(event.item, ev.MessageItem)
    part = event.item.content[0]
    assert (part.type, part.image_url, part.detail) == ("input_image", "data:image/png;base64,AAAA", "high")
    with pytest.raises(ev.ProtocolError) as caught:
        ev.parse_client_event(_create({"type": "input_image", "image_url": "x", "detail": "medium"}))
    assert (caught.value.code, caught.value.param, caught.value.event_id) == (
        "invalid_value", "item.content.0.detail", "evt_1")


def _parts(limits: ImageLimits = LIMITS, max_images: int = 16,
           budget_tokens: int = 4096) -> tuple[ClientItemReader, ConversationItems, Outbox]:
    engine = cast(Engine, SimpleNamespace(info=INFO))  # nothing here reaches the engine but its info
    outbox = Outbox(64)
    sender = EventSender(outbox, ev.Dialect.GA)
    reporter = ErrorReporter(sender, GatewayMetrics(), "sess_test")
    checks = RequestChecks(engine, ev.Dialect.GA, reporter)
    settings = SessionSettings(ev.SessionConfig(model="tiny", turn_detection=None), checks, reporter, sender)
    items = ConversationItems(Conversation(budget_tokens, 16_000 * 60, max_images),
                              Transcriber(engine, sender, "sess_test"), settings, sender, reporter, 60.0)
    return ClientItemReader(settings, checks, reporter, limits), items, outbox


def _events(outbox: Outbox) -> list[dict[str, Any]]:
    return [json.loads(p) for p in iter(outbox.get_nowait, None) if isinstance(p, str)]


async def _deliver(reader: ClientItemReader, items: ConversationItems, raw: str) -> None:
    event = ev.parse_client_event(raw)
    assert isinstance(event, ev.ConversationItemCreate)
    await item_events.create(reader, items, event)


async def test_an_item_s_image_joins_the_conversation_and_is_echoed_without_its_data() -> None:
    reader, items, outbox = _parts()
    await _deliver(reader, items, _create({"type": "input_text", "text": "what is this?"},
                                          {"type": "input_image", "image_url": _data_url(_png()), "detail": "auto"}))
    [item] = items.conversation.items
    assert item.text == "what is this?" and item.image_sizes == ((4, 6),)
    np.testing.assert_array_equal(item.images[0].pixels, PIXELS)
    events = _events(outbox)
    assert [e["type"] for e in events] == ["conversation.item.added", "conversation.item.done"]
    for event in events:
        assert event["item"]["content"] == [{"type": "input_image"}, {"type": "input_text", "text": "what is this?"}]
        TypeAdapter(ga.ConversationItemAdded | ga.ConversationItemDone).validate_python(event)
    [message] = prompt_messages(items.conversation.items, "")
    assert [type(p).__name__ for p in message.content] == ["ImagePart", "TextPart"]


@pytest.mark.parametrize("content, role, code, param", [
    ([{"type": "input_image", "image_url": _data_url(b"not an image")}], "user", "invalid_image",
     "item.content.0.image_url"),
    ([{"type": "input_text", "text": "see"}, {"type": "input_image", "image_url": _data_url(_png()[:40])}], "user",
     "invalid_image", "item.content.1.image_url"),
    ([{"type": "input_image", "image_url": "https://example.com/a.png"}], "user", "image_url_not_allowed",
     "item.content.0.image_url"),
    ([{"type": "input_image", "image_url": "data:text/plain;base64,aGk="}], "user", "invalid_image_url",
     "item.content.0.image_url"),
    ([{"type": "input_image"}], "user", "missing_required_parameter", "item.content.0.image_url"),
    ([{"type": "input_image", "image_url": _data_url(_png())}], "system", "invalid_value", "item.content.0.type"),
    ([{"type": "input_image", "image_url": _data_url(_png())}] * 3, "user", "too_many_images", "item.content"),
])
async def test_a_bad_image_is_an_error_event_and_no_item(content: list[dict[str, Any]], role: str, code: str,
                                                         param: str) -> None:
    reader, items, outbox = _parts(ImageLimits(max_images_per_request=2))
    await _deliver(reader, items, _create(*content, role=role))
    [event] = _events(outbox)
    assert event["type"] == "error", event
    assert (event["error"]["code"], event["error"]["param"], event["error"]["event_id"]) == (code, param, "evt_1")
    assert event["error"]["type"] == "invalid_request_error"
    assert items.conversation.items == []
    await _deliver(reader, items, _create({"type": "input_image", "image_url": _data_url(_png())}))
    assert [e["type"] for e in _events(outbox)] == ["conversation.item.added", "conversation.item.done"]


async def test_a_conversation_keeps_its_newest_images_only() -> None:
    reader, items, outbox = _parts(max_images=3)
    two = ({"type": "input_image", "image_url": _data_url(_png())},) * 2
    for n in range(3):
        await _deliver(reader, items, _create({"type": "input_text", "text": f"look {n}"}, *two, item_id=f"i{n}"))
    kept = [len(item.images) for item in items.conversation.items]
    assert kept == [0, 0, 2]  # i1's two would pass the bound of 3: it goes whole, and everything older with it
    assert [item.images_dropped for item in items.conversation.items] == [True, True, False]
    assert items.conversation.image_count() == 2
    assert not [e for e in _events(outbox) if e["type"] == "error"]  # the new item kept its own: nothing to say
    # the items stay, text and all, and still show what they held
    first = protocol_item(items.conversation.items[0])
    assert isinstance(first, ev.MessageItem) and [p.type for p in first.content] == [
        "input_image", "input_image", "input_text"]
    messages = prompt_messages(items.conversation.items, "")
    assert [sum(isinstance(p, ImagePart) for p in m.content) for m in messages] == [0, 0, 2]
    await items.close()
    assert items.conversation.image_count() == 0


async def test_items_the_prompt_leaves_out_let_go_of_their_images_first() -> None:
    # room for the image item or the long text after it, not both: truncation takes the image item out
    reader, items, outbox = _parts(budget_tokens=600)
    await _deliver(reader, items, _create({"type": "input_image", "image_url": _data_url(_png())}, item_id="old"))
    assert items.conversation.image_count() == 1
    await _deliver(reader, items, _create({"type": "input_text", "text": "word " * 600}, item_id="talk"))
    old = items.conversation.get("old")
    assert old is not None and old.images == () and old.images_dropped
    assert not [e for e in _events(outbox) if e["type"] == "error"]


async def test_an_item_whose_images_cannot_be_kept_stays_without_them_and_says_so() -> None:
    reader, items, outbox = _parts(budget_tokens=200)  # less than one large image takes (400 tokens)
    big = _data_url(_png(np.zeros((720, 1280, 3), np.uint8)))
    await _deliver(reader, items, _create({"type": "input_image", "image_url": big}, item_id="big"))
    [item] = items.conversation.items
    assert item.images_dropped and item.image_sizes == ((720, 1280),)
    error = [e for e in _events(outbox) if e["type"] == "error"][0]["error"]
    assert (error["code"], error["param"], error["event_id"]) == ("input_image_dropped", "item.content", "evt_1")


def test_an_image_counts_toward_the_prompt_s_size_after_it_is_dropped() -> None:
    item = Item("i", "user", text="hi", images=(ImagePart(np.zeros((720, 1280, 3), np.uint8)),),
                image_sizes=((720, 1280),))
    with_image = item.estimated_tokens()
    assert with_image >= Item("j", "user", text="hi").estimated_tokens() + 400
    item.drop_images()
    assert item.estimated_tokens() == with_image  # trimming stays oldest-first, as with dropped audio
