"""The outbox's verdict on a send: response audio past the bound is refused as SLOW_CONSUMER, control events never."""

from __future__ import annotations

import json

import numpy as np

from voice_gateway.realtime.audio_sinks import OpusSink, Pcm16Sink
from voice_gateway.realtime.events import Dialect, InputAudioCleared
from voice_gateway.realtime.outbox import Delivery, Outbox
from voice_gateway.realtime.sender import EventSender


def test_audio_past_the_bound_is_refused_and_not_queued() -> None:
    outbox = Outbox(2)
    assert outbox.put("a", "resp_1") is Delivery.QUEUED
    assert outbox.put("b", "resp_1") is Delivery.QUEUED
    assert outbox.put("c", "resp_1") is Delivery.SLOW_CONSUMER
    assert len(outbox) == 2
    assert outbox.put("control", force=True) is Delivery.QUEUED  # control events may pass the bound
    assert outbox.drop("resp_1") == 2 and outbox.get_nowait() == "control"


def test_a_sink_returns_the_verdict_of_its_sends() -> None:
    sender = EventSender(Outbox(1), Dialect.GA)
    sink = Pcm16Sink(sender)
    sink.begin("resp_1", "item_1")
    assert sink.write(np.zeros(480, np.float32)) is Delivery.QUEUED
    assert sink.write(np.zeros(480, np.float32)) is Delivery.SLOW_CONSUMER
    assert sender.event(InputAudioCleared()) is Delivery.QUEUED
    sent = []
    while (payload := sender.outbox.get_nowait()) is not None:
        sent.append(json.loads(payload)["type"])
    assert sent == ["response.output_audio.delta", "input_audio_buffer.cleared"]


def test_an_opus_sink_stops_at_the_first_refused_packet() -> None:
    sender = EventSender(Outbox(2), Dialect.GA)
    sink = OpusSink(sender, 32_000)
    sink.begin("resp_1", "item_1")
    assert sink.write(np.zeros(24_000, np.float32)) is Delivery.SLOW_CONSUMER  # 1 s: 50 packets for 2 places
    assert len(sender.outbox) == 2
    assert sink.cancel() == 2 and len(sender.outbox) == 0
