"""Session edge cases: a reader that falls behind, clearing WebRTC playback, and the concurrent-session count."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from engine import create_engine, load_profile
from voice_gateway.admission import Admission, Refused
from voice_gateway.app import create_app
from voice_gateway.config import GatewayConfig
from voice_gateway.metrics import GatewayMetrics
from voice_gateway.realtime.audio_sinks import PlayedCut, TrackSink
from voice_gateway.realtime.events import Dialect
from voice_gateway.realtime.frames import deliver
from voice_gateway.realtime.outbox import Outbox
from voice_gateway.realtime.sender import EventSender
from voice_gateway.realtime.session import Session


def _drain(session: Session) -> list[dict]:
    out = []
    while (payload := session.outbox.get_nowait()) is not None:
        out.append(json.loads(payload))
    return out


async def test_a_reader_that_falls_behind_gets_slow_consumer(tiny_checkpoint: Path, cache_dir: Path) -> None:
    engine = create_engine("tiny", load_profile(model="tiny", platform="cpu"), cache_dir)
    await engine.start()
    try:
        # nobody drains this outbox: the reply's audio cannot be queued
        session = Session(engine, GatewayConfig(send_queue_messages=16), Dialect.GA, GatewayMetrics(), "test")
        session.open()
        await deliver(session, json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}}))
        await deliver(session, json.dumps({"type": "response.create"}))
        assert session.response is not None and session.response.task is not None
        await asyncio.wait_for(session.response.task, 60)
        events = _drain(session)
        errors = [e for e in events if e["type"] == "error"]
        assert [e["error"]["code"] for e in errors] == ["slow_consumer"]
        done = next(e for e in events if e["type"] == "response.done")
        assert done["response"]["status"] == "failed"
        assert done["response"]["status_details"]["error"]["code"] == "slow_consumer"
        for _ in range(50):
            if engine.num_active_requests() == 0 and not any(engine.stage_load().values()):
                break
            await asyncio.sleep(0.05)
        assert engine.num_active_requests() == 0 and not any(engine.stage_load().values())
    finally:
        await engine.stop()


async def test_output_audio_buffer_clear(tiny_checkpoint: Path, cache_dir: Path) -> None:
    engine = create_engine("tiny", load_profile(model="tiny", platform="cpu"), cache_dir)
    websocket = Session(engine, GatewayConfig(), Dialect.GA, GatewayMetrics(), "websocket")
    await deliver(websocket, json.dumps({"type": "output_audio_buffer.clear", "event_id": "evt_1"}))
    error = _drain(websocket)[-1]
    assert error["type"] == "error" and error["error"]["event_id"] == "evt_1"

    webrtc = Session(engine, GatewayConfig(), Dialect.GA, GatewayMetrics(), "webrtc", audio_on_track=True)
    track = webrtc.track
    assert track is not None
    track.begin("resp_playing", "item_1")
    track.write(np.full(4800, 0.1, np.float32))  # 200 ms, finished generating but still playing out
    track.finish()
    assert track.next_frame().any() and track.playing == "resp_playing"
    await deliver(webrtc, json.dumps({"type": "output_audio_buffer.clear"}))
    assert track.playing is None and not track.next_frame().any()
    events = _drain(webrtc)
    assert [e["type"] for e in events] == ["output_audio_buffer.started", "output_audio_buffer.cleared"]
    assert events[-1]["response_id"] == "resp_playing"


def test_a_track_says_when_each_reply_starts_and_stops_playing() -> None:
    sender = EventSender(Outbox(64), Dialect.GA)
    track = TrackSink(sender)
    track.begin("resp_1", "item_1")
    track.write(np.full(2400, 0.1, np.float32))  # 100 ms at 24 kHz: 5 frames
    assert track.next_frame().any() and track.playing == "resp_1"
    for _ in range(10):  # the reply is still generating: running short is not the end
        track.next_frame()
    assert track.playing == "resp_1"
    track.finish()
    track.next_frame()
    track.begin("resp_2", "item_2")
    track.write(np.full(480, 0.1, np.float32))  # shorter than the resampler's delay: finish brings it out
    track.finish()
    for _ in range(10):
        track.next_frame()
    assert track.playing is None
    events = []
    while (payload := sender.outbox.get_nowait()) is not None:
        events.append(json.loads(payload))
    assert [(e["type"], e["response_id"]) for e in events] == [
        ("output_audio_buffer.started", "resp_1"), ("output_audio_buffer.stopped", "resp_1"),
        ("output_audio_buffer.started", "resp_2"), ("output_audio_buffer.stopped", "resp_2")]


def test_a_reply_cut_off_mid_play_says_how_much_of_its_item_left() -> None:
    """What left on the track is counted per reply from its first frame; a reply that played out, or one still
    queued, is not cut."""
    track = TrackSink(EventSender(Outbox(64), Dialect.GA))
    track.begin("resp_1", "item_1")
    track.write(np.full(2400, 0.1, np.float32))
    track.finish()
    for _ in range(10):
        track.next_frame()
    assert track.playing is None
    track.cancel()
    assert track.cut is None  # it had played out
    track.begin("resp_2", "item_2")
    track.write(np.full(24_000, 0.1, np.float32))  # 1 s
    for _ in range(15):  # 300 ms leave
        track.next_frame()
    track.cancel()
    assert track.cut == PlayedCut("item_2", 300)
    track.begin("resp_3", "item_3")
    track.write(np.full(2400, 0.1, np.float32))
    track.cancel()
    assert track.cut == PlayedCut("item_2", 300)  # resp_3 never played: nothing new was cut


# Offers that pass the admission checks but that aiortc cannot use: a missing ICE ufrag, a line it cannot split.
BAD_OFFERS = ("v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n", "m=audio garbage")


def test_refused_webrtc_offers_give_back_only_the_place_they_took(tiny_checkpoint: Path, cache_dir: Path) -> None:
    engine = create_engine("tiny", load_profile(model="tiny", platform="cpu"), cache_dir)
    with TestClient(create_app(engine, GatewayConfig(max_sessions=2, allowed_hosts=("testserver",)))) as client:
        for i in range(10):
            answer = client.post("/v1/realtime/calls", content=BAD_OFFERS[i % 2],
                                 headers={"content-type": "application/sdp"})
            assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_sdp", answer.text
        assert client.get("/health").json()["active_sessions"] == 0
        with client.websocket_connect("/v1/realtime") as first, client.websocket_connect("/v1/realtime") as second:
            assert first.receive_json()["type"] == second.receive_json()["type"] == "session.created"
            assert client.get("/health").json()["active_sessions"] == 2
            with client.websocket_connect("/v1/realtime") as third:
                error = third.receive_json()
                assert error["type"] == "error" and error["error"]["code"] == "too_many_sessions"
                with pytest.raises(WebSocketDisconnect) as closed:
                    third.receive_json()
                assert closed.value.code == 1013
            full = client.post("/v1/realtime/calls", content=BAD_OFFERS[0], headers={"content-type": "application/sdp"})
            assert full.status_code == 503 and full.json()["error"]["code"] == "too_many_sessions"
        assert client.get("/health").json()["active_sessions"] == 0


def test_a_slot_is_released_once(tiny_checkpoint: Path, cache_dir: Path) -> None:
    engine = create_engine("tiny", load_profile(model="tiny", platform="cpu"), cache_dir)
    admission = Admission(GatewayConfig(max_sessions=1), engine, GatewayMetrics())
    slot = admission.acquire("test")
    with pytest.raises(Refused) as refused:
        admission.acquire("test")
    assert refused.value.code == "too_many_sessions" and refused.value.status == 503
    slot.release()
    slot.release()
    assert admission.active_sessions == 0
    admission.acquire("test")
    with pytest.raises(Refused):
        admission.acquire("test")
