"""A session's parts work on their own: the item handlers take the parts they change, no Session behind them."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, cast

import numpy as np

from engine import Engine, ModelInfo
from voice_gateway.media.images import ImageLimits
from voice_gateway.metrics import GatewayMetrics
from voice_gateway.realtime import events as ev
from voice_gateway.realtime import item_events
from voice_gateway.realtime.audio_input import AudioInput
from voice_gateway.realtime.checks import RequestChecks
from voice_gateway.realtime.client_items import ClientItemReader
from voice_gateway.realtime.conversation import Conversation
from voice_gateway.realtime.conversation_items import ConversationItems
from voice_gateway.realtime.input_buffer import InputAudioBuffer
from voice_gateway.realtime.outbox import Outbox
from voice_gateway.realtime.reporter import ErrorReporter
from voice_gateway.realtime.sender import EventSender
from voice_gateway.realtime.settings import SessionSettings
from voice_gateway.realtime.transcription import Transcriber
from voice_gateway.realtime.turns import TurnTaking

INFO = ModelInfo(model_id="tiny", is_random_weights=True, description="", max_model_len=4096, speakers=("ethan",),
                 codec_frame_samples=1920, temperature=0.7)


def _parts() -> tuple[ClientItemReader, ConversationItems, AudioInput, Outbox]:
    engine = cast(Engine, SimpleNamespace(info=INFO))  # nothing here reaches the engine but its info
    outbox = Outbox(64)
    sender = EventSender(outbox, ev.Dialect.GA)
    reporter = ErrorReporter(sender, GatewayMetrics(), "sess_test")
    checks = RequestChecks(engine, ev.Dialect.GA, reporter)
    config = ev.SessionConfig(model="tiny", turn_detection=None)
    settings = SessionSettings(config, checks, reporter, sender)
    audio_input = AudioInput(InputAudioBuffer(10.0), TurnTaking(config.turn_detection))
    items = ConversationItems(Conversation(4096, 16_000 * 60, 16), Transcriber(engine, sender, "sess_test"), settings,
                              sender, reporter, 60.0)
    return ClientItemReader(settings, checks, reporter, ImageLimits()), items, audio_input, outbox


def _events(outbox: Outbox) -> list[dict[str, Any]]:
    return [json.loads(p) for p in iter(outbox.get_nowait, None) if isinstance(p, str)]


def _create(item_id: str, previous: str | None = None) -> ev.ConversationItemCreate:
    item = ev.MessageItem(id=item_id, role="user", content=[ev.ContentPart(type="input_text", text="hi")])
    return ev.ConversationItemCreate(item=item, previous_item_id=previous)


async def test_item_handlers_take_the_parts_they_change() -> None:
    reader, items, _, outbox = _parts()
    await item_events.create(reader, items, _create("a"))
    await item_events.create(reader, items, _create("a"))
    await item_events.create(reader, items, _create("b", previous="nope"))
    await item_events.delete(items, ev.ConversationItemDelete(item_id="a"))
    await item_events.retrieve(items, ev.ConversationItemRetrieve(item_id="a"))
    events = _events(outbox)
    assert [e["type"] for e in events] == ["conversation.item.added", "conversation.item.done", "error", "error",
                                           "conversation.item.deleted", "error"]
    assert [e["error"]["code"] for e in events if e["type"] == "error"] == [
        "item_create_duplicate_item_id", "item_create_invalid_previous_item_id", "item_retrieve_invalid_item_id"]
    assert items.conversation.items == []


async def test_committed_audio_becomes_an_item_with_the_buffer_s_id() -> None:
    _, items, audio_input, outbox = _parts()
    assert await audio_input.append(np.zeros(3_200, np.float32)) == []  # no turn detection: no speech events
    assert audio_input.duration_ms == 200 and audio_input.span_ms == (0, 200)
    samples, item_id = audio_input.take_all()
    items.commit_audio(samples, item_id)
    assert audio_input.duration_ms == 0 and audio_input.span_ms == (200, 200)
    assert [e["type"] for e in _events(outbox)] == ["input_audio_buffer.committed", "conversation.item.added",
                                                    "conversation.item.done"]
    assert [(i.id, i.audio_ms) for i in items.conversation.items] == [(item_id, 200)]


async def test_an_item_s_audio_is_resampled_whole_and_apart_from_the_input_stream() -> None:
    reader, items, audio_input, _ = _parts()
    pcm = (np.sin(np.arange(4_800) / 7) * 8_000).astype("<i2").tobytes()  # 200 ms at 24 kHz
    first = audio_input.decode(pcm, ev.AudioFormat.PCM16)
    audio = ev.ContentPart(type="input_audio", audio=pcm)
    await item_events.create(reader, items, ev.ConversationItemCreate(
        item=ev.MessageItem(id="clip", role="user", content=[audio])))
    assert items.conversation.items[0].audio_ms == 200  # all of it: no filter delay held back
    fresh = _parts()[2]
    fresh.decode(pcm, ev.AudioFormat.PCM16)
    # the append stream goes on as if the item never was
    np.testing.assert_array_equal(audio_input.decode(pcm, ev.AudioFormat.PCM16),
                                  fresh.decode(pcm, ev.AudioFormat.PCM16))
    assert first.size < 3_200
