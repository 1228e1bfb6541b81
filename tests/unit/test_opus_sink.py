"""OpusSink: packets encoded off the event loop keep their order and their place among events; cancel drops them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from voice_gateway.audio.opus import FRAME_INPUT_SAMPLES, OpusPacket, OpusStream
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.audio_sinks import OpusSink
from voice_gateway.realtime.outbox import Outbox, OutboxFull
from voice_gateway.realtime.sender import EventSender

RATE_HZ = 24_000
CHUNK_SIZES = (7680, 480, 1, 15360, 48000, 5000)  # the engine's chunks are 4-25 codec frames; odd sizes too


def _tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE_HZ)) / RATE_HZ
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


async def _drain(outbox: Outbox) -> list[str | bytes]:
    outbox.close()
    out = []
    while (payload := await outbox.get()) is not None:
        out.append(payload)
    return out


def _done(response_id: str) -> ev.ServerEvent:
    return ev.OutputAudioDone(response_id=response_id, item_id="item")


async def test_packets_keep_their_order_and_their_place_among_events() -> None:
    outbox = Outbox(4096)
    sender = EventSender(outbox, ev.Dialect.GA)
    sink = OpusSink(sender, 64_000)
    audio = _tone(sum(CHUNK_SIZES) / RATE_HZ)
    sink.begin("resp_1", "item")
    start = 0
    for size in CHUNK_SIZES:
        sink.write(audio[start : start + size])
        start += size
        sender.event(ev.OutputAudioTranscriptDelta(response_id="resp_1", item_id="item", delta="x"))
    sink.finish()
    sender.event(_done("resp_1"))
    out = await _drain(outbox)

    kinds = ["packet" if isinstance(m, bytes) else json.loads(m)["type"] for m in out]
    assert kinds[-1] == "response.output_audio.done" and "response.output_audio.done" not in kinds[:-1]
    packets = [OpusPacket.unpack(m) for m in out if isinstance(m, bytes)]
    assert [p.sample_offset for p in packets] == [i * FRAME_INPUT_SAMPLES for i in range(len(packets))]
    assert [p.sequence for p in packets] == list(range(len(packets)))
    assert len(packets) * FRAME_INPUT_SAMPLES >= audio.size
    # each write's packets, the same ones a stream on this thread makes, come before the event queued after it
    reference, expected, start = OpusStream(bitrate_bps=64_000), [], 0
    for size in CHUNK_SIZES:
        expected += [p.pack() for p in reference.encode(audio[start : start + size])]
        expected.append("response.output_audio_transcript.delta")
        start += size
    expected += [p.pack() for p in reference.flush()] + ["response.output_audio.done"]
    assert [m if isinstance(m, bytes) else json.loads(m)["type"] for m in out] == expected


async def test_cancel_drops_queued_audio_and_the_next_response_starts_clean() -> None:
    outbox = Outbox(4096)
    sender = EventSender(outbox, ev.Dialect.GA)
    sink = OpusSink(sender, 64_000)
    sink.begin("resp_1", "item")
    for _ in range(10):
        sink.write(_tone(1.0))
    assert sink.cancel() > 0
    assert len(outbox) == 0
    sink.begin("resp_2", "item")
    sink.write(_tone(1.0))
    sink.finish()
    sender.event(_done("resp_2"))
    out = await _drain(outbox)

    packets = [OpusPacket.unpack(m) for m in out if isinstance(m, bytes)]
    assert [p.sample_offset for p in packets] == [i * FRAME_INPUT_SAMPLES for i in range(len(packets))]
    assert len(packets) == 51  # 1 s is 50 packets, and the flush's lookahead one
    sequences = [p.sequence for p in packets]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)
    assert isinstance(out[-1], str) and json.loads(out[-1])["type"] == "response.output_audio.done"


async def test_a_full_outbox_refuses_audio_at_write() -> None:
    outbox = Outbox(16)
    sink = OpusSink(EventSender(outbox, ev.Dialect.GA), 64_000)
    sink.begin("resp_1", "item")
    sink.write(_tone(0.2))  # 10 packets
    with pytest.raises(OutboxFull):
        sink.write(_tone(0.2))
