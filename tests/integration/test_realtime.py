"""WS /v1/realtime with the official SDK's GA and beta clients, and a raw websockets client."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import subprocess
import time
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf
import websockets
from openai import AsyncOpenAI

from engine import load_profile
from tests.conftest import Server, start_server, stop_server
from voice_gateway.audio.opus import OpusPacket
from voice_gateway.audio.resample import resample

RATE = 24_000
UTTERANCE = "Hello there. What is the weather like today?"


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), np.float32)


@pytest.fixture(scope="session")
def speech(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """The utterance spoken by espeak-ng, as float32 at 24 kHz."""
    path = tmp_path_factory.mktemp("speech") / "utterance.wav"
    subprocess.run(["espeak-ng", "-w", str(path), UTTERANCE], check=True)
    samples, rate = sf.read(path, dtype="float32")
    assert np.abs(samples).max() > 0.1
    return resample(samples, rate, RATE)


def client_for(server: Server) -> AsyncOpenAI:
    ws_url = server.base_url.replace("http://", "ws://") + "/v1"
    # the beta client always uses wss:// unless told where the WebSocket lives
    return AsyncOpenAI(base_url=server.base_url + "/v1", websocket_base_url=ws_url, api_key="unused", max_retries=0)


async def append_audio(conn, samples: np.ndarray, chunk_s: float = 0.1) -> None:
    data = pcm16(samples)
    step = int(chunk_s * RATE) * 2
    for i in range(0, len(data), step):
        await conn.input_audio_buffer.append(audio=base64.b64encode(data[i : i + step]).decode())


async def events_until(conn, last: str, timeout_s: float = 60) -> list:
    seen = []
    async with asyncio.timeout(timeout_s):
        async for event in conn:
            seen.append(event)
            if event.type == last:
                return seen
    raise AssertionError(f"connection closed before {last}")


def first(events: list, kind: str) -> int:
    return next(i for i, e in enumerate(events) if e.type == kind)


def chunk_sizes(frames: int) -> list[int]:
    """The chunks the tiny profile cuts a reply of `frames` codec frames into for Code2Wav."""
    chunks = load_profile(model="tiny", platform="cpu").async_chunk
    sizes: list[int] = []
    while sum(sizes) < frames:
        sizes.append(min(chunks.size(len(sizes)), frames - sum(sizes)))
    return sizes


@pytest.mark.parametrize("dialect", ["ga", "beta"])
async def test_a_spoken_turn_with_server_vad(server: Server, speech: np.ndarray, dialect: str) -> None:
    audio_delta = "response.output_audio.delta" if dialect == "ga" else "response.audio.delta"
    async with client_for(server) as client:
        realtime = client.realtime if dialect == "ga" else client.beta.realtime
        async with realtime.connect(model="tiny") as conn:
            created = await conn.recv()
            assert created.type == "session.created"
            await append_audio(conn, np.concatenate([silence(0.5), speech, silence(1.0)]))
            events = await events_until(conn, "response.done")
    order = [first(events, k) for k in (
        "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
        "response.created", audio_delta, "response.done")]
    assert order == sorted(order), [e.type for e in events]
    started = events[order[0]]
    stopped = events[order[1]]
    speech_ms = len(speech) * 1000 // RATE
    assert 400 <= started.audio_start_ms <= 700  # the speech starts at 500 ms
    assert 500 + speech_ms - 200 <= stopped.audio_end_ms <= 500 + speech_ms + 300
    deltas = [e for e in events if e.type == audio_delta]
    done = events[-1].response
    assert done.status == "completed"
    frames = done.usage.output_token_details.audio_tokens
    assert frames > 0
    # streamed: a delta per Code2Wav chunk as it is decoded (a sampled reply may stop after its first chunk)
    assert len(deltas) == len(chunk_sizes(frames))
    heard = sum(len(base64.b64decode(d.delta)) // 2 for d in deltas)
    assert heard == frames * 1920 - 555


async def test_barge_in_cancels_the_reply(server: Server, speech: np.ndarray) -> None:
    async with client_for(server) as client, client.realtime.connect(model="tiny") as conn:
        await conn.recv()
        await append_audio(conn, np.concatenate([silence(0.3), speech, silence(1.0)]))
        events = []
        async with asyncio.timeout(60):
            async for event in conn:
                events.append(event)
                if event.type == "response.output_audio.delta":
                    break
        response_id = events[-1].response_id
        # the user talks over the reply
        await append_audio(conn, speech)
        after = await events_until(conn, "response.done")
    done = after[-1].response
    assert done.id == response_id
    assert done.status == "cancelled" and done.status_details.reason == "turn_detected"
    assert any(e.type == "input_audio_buffer.speech_started" for e in after)
    cut = next(i for i, e in enumerate(after) if e.type == "input_audio_buffer.speech_started")
    assert not [e for e in after[cut:] if e.type == "response.output_audio.delta"]
    deadline = time.monotonic() + 1.0
    while (health := server.get("/health").json())["active_requests"] and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert health["active_requests"] == 0, health


async def test_truncate_cuts_what_was_not_heard(server: Server, speech: np.ndarray) -> None:
    async with client_for(server) as client, client.realtime.connect(model="tiny") as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
        await events_until(conn, "session.updated")
        await append_audio(conn, speech)
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        events = await events_until(conn, "response.done")
        item = events[-1].response.output[0]
        full = item.content[0].transcript
        # the tiny model's sampled reply may be shorter than a second: cut inside what was sent
        sent_ms = sum(len(base64.b64decode(e.delta)) // 2 for e in events
                      if e.type == "response.output_audio.delta") * 1000 // RATE
        cut = min(1000, sent_ms // 2)
        await conn.conversation.item.truncate(item_id=item.id, content_index=0, audio_end_ms=cut)
        truncated = await events_until(conn, "conversation.item.truncated")
    assert not [e for e in truncated if e.type == "error"], truncated
    assert truncated[-1].audio_end_ms == cut > 0
    assert full


async def test_an_out_of_band_response_beside_the_conversation(server: Server) -> None:
    """A classifier beside the conversation, as OpenAI's guide has it: conversation "none" with its own input."""
    def user_text(text: str) -> dict:
        return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}

    async with client_for(server) as client, client.realtime.connect(model="tiny") as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
        await events_until(conn, "session.updated")
        await conn.conversation.item.create(item={"id": "turn_1", **user_text("Book a table for two.")})
        await events_until(conn, "conversation.item.done")
        await conn.response.create(response={
            "conversation": "none", "metadata": {"purpose": "classify"}, "max_output_tokens": 4,
            "input": [user_text("Is this a booking? Answer yes or no."), {"type": "item_reference", "id": "turn_1"}]})
        oob = await events_until(conn, "response.done")
        await conn.response.create(response={"conversation": "sideways"}, event_id="evt_bad_conversation")
        bad_conversation = await events_until(conn, "error")
        await conn.response.create(response={"conversation": "none", "input": [
            {"type": "item_reference", "id": "turn_1"}, {"type": "item_reference", "id": "turn_0"}]})
        bad_reference = await events_until(conn, "error")
        oob_item = oob[-1].response.output[0]
        await conn.conversation.item.retrieve(item_id=oob_item.id)
        not_found = await events_until(conn, "error")
        await conn.response.create(response={"max_output_tokens": 4})
        in_band = await events_until(conn, "response.done")
    types = [e.type for e in oob]
    assert "response.output_item.added" in types and "response.output_audio.delta" in types
    assert not [e for e in oob if e.type.startswith("conversation.item.")], types
    done = oob[-1].response
    assert done.status == "completed" and done.metadata == {"purpose": "classify"}
    assert done.output[0].content[0].transcript
    error = bad_conversation[-1].error
    assert (error.param, error.event_id) == ("response.conversation", "evt_bad_conversation")
    assert (bad_reference[-1].error.code, bad_reference[-1].error.param) == ("item_not_found", "response.input.1.id")
    assert not_found[-1].error.code == "item_retrieve_invalid_item_id"  # the out-of-band reply is in no conversation
    assert not [e for e in bad_conversation + bad_reference if e.type == "response.created"]
    added = [e.item.id for e in in_band if e.type == "conversation.item.added"]
    assert in_band[-1].response.status == "completed" and added == [in_band[-1].response.output[0].id]
    # the next prompt is the conversation's: the booking turn alone, without the out-of-band input or output
    assert in_band[-1].response.usage.input_tokens < done.usage.input_tokens


def _ws_url(server: Server) -> str:
    return server.base_url.replace("http://", "ws://") + "/v1/realtime?model=tiny"


async def _raw_turn(ws, speech: np.ndarray) -> tuple[list[dict], list[bytes]]:
    data = pcm16(speech)
    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(data).decode()}))
    await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    await ws.send(json.dumps({"type": "response.create"}))
    events, binary = [], []
    async with asyncio.timeout(60):
        while True:
            message = await ws.recv()
            if isinstance(message, bytes):
                binary.append(message)
                continue
            events.append(json.loads(message))
            if events[-1]["type"] == "response.done":
                return events, binary


@pytest.mark.parametrize("asked", [True, False], ids=["timing", "no-timing"])
async def test_response_timing_follows_a_reply_that_response_create_asked_for(server: Server, speech: np.ndarray,
                                                                              asked: bool) -> None:
    """Our extension: with `?timing=1`, a reply asked for by response.create after a commit ends with
    `response.timing` too, its times from the asking (no turn was decided), the engine's own first packet split by
    stage; without it, the event never comes."""
    async with websockets.connect(_ws_url(server) + ("&timing=1" if asked else "")) as ws:
        await ws.recv()
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime",
                                  "audio": {"input": {"turn_detection": None}}}}))
        assert json.loads(await ws.recv())["type"] == "session.updated"
        events, _ = await _raw_turn(ws, speech)
        # events leave in order: whatever follows response.done comes before the answer to this
        await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
        after = []
        async with asyncio.timeout(10):
            while not after or after[-1]["type"] != "input_audio_buffer.cleared":
                after.append(json.loads(await ws.recv()))
    done = events[-1]["response"]
    assert done["status"] == "completed"
    timings = [e for e in events + after if e["type"] == "response.timing"]
    if not asked:
        assert timings == [], timings
        return
    assert [e["type"] for e in after] == ["response.timing", "input_audio_buffer.cleared"]
    [timing] = timings
    assert timing["response_id"] == done["id"]
    assert timing["turn_ms"] is None and timing["heard_ms"] is None and timing["ears_ms"] is None, timing
    assert 0 <= timing["reply_started_ms"] <= timing["first_token_ms"] <= timing["first_audio_ms"], timing
    # the engine's own clock starts at its request and stops at its first packet, inside the edge's span
    engine_ms, parts = timing["engine_first_packet_ms"], timing["first_packet_parts_ms"]
    assert 0 < engine_ms <= timing["first_audio_ms"] - timing["reply_started_ms"] + 2, timing
    assert set(parts) == {"queued_ms", "thinker_ms", "talker_prefill_ms", "talker_frames_ms", "code2wav_ms"}
    assert all(ms >= 0 for ms in parts.values()) and abs(sum(parts.values()) - engine_ms) <= 1, timing


def _low_pass(samples: np.ndarray, cutoff_hz: float) -> np.ndarray:
    spectrum = np.fft.rfft(samples)
    spectrum[np.fft.rfftfreq(len(samples), 1 / RATE) > cutoff_hz] = 0
    return np.fft.irfft(spectrum, len(samples))


def _decode_opus(packets: list[OpusPacket]) -> np.ndarray:
    decoder = av.CodecContext.create("libopus", "r")
    decoder.sample_rate, decoder.layout = 48_000, "mono"
    out = []
    for p in packets:
        for frame in decoder.decode(av.Packet(p.payload)):
            samples = frame.to_ndarray().reshape(-1)
            out.append(samples / 32768.0 if samples.dtype == np.int16 else samples)
    return resample(np.concatenate(out).astype(np.float32), 48_000, RATE)


@pytest.fixture(scope="module")
def greedy_server(tiny_checkpoint: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    greedy = '{"talker": {"sampling": {"temperature": 0}, "code_sampling": {"temperature": 0}}}'
    # The tiny model's "speech" is broadband noise, the hardest signal for a perceptual codec.
    proc, srv = start_server(cache_dir, tmp_path_factory.mktemp("greedy") / "server.log",
                             "--stage-overrides", greedy, "--opus-bitrate", "128000")
    yield srv
    stop_server(proc)


async def test_opus_packets_match_the_pcm_reply(greedy_server: Server, speech: np.ndarray) -> None:
    manual = {"turn_detection": None, "temperature": 0}
    replies = {}
    for fmt in ("pcm16", "opus"):
        async with websockets.connect(_ws_url(greedy_server), additional_headers={"OpenAI-Beta": "realtime=v1"}) as ws:
            await ws.recv()
            await ws.send(json.dumps({"type": "session.update", "session": {**manual, "output_audio_format": fmt}}))
            assert json.loads(await ws.recv())["type"] == "session.updated"
            replies[fmt] = await _raw_turn(ws, speech)
    pcm_events, pcm_binary = replies["pcm16"]
    opus_events, opus_binary = replies["opus"]
    assert not pcm_binary
    assert not [e for e in opus_events if e["type"] == "response.audio.delta"]
    reference = np.concatenate([
        np.frombuffer(base64.b64decode(e["delta"]), "<i2").astype(np.float32) / 32768
        for e in pcm_events if e["type"] == "response.audio.delta"])
    packets = [OpusPacket.unpack(b) for b in opus_binary]
    assert [p.sequence for p in packets] == list(range(packets[0].sequence, packets[0].sequence + len(packets)))
    assert all(b.timestamp - a.timestamp == 960 for a, b in itertools.pairwise(packets))
    assert [p.sample_offset for p in packets] == [480 * i for i in range(len(packets))]
    decoded = _decode_opus(packets)
    lag = int(np.argmax(np.correlate(decoded[:RATE], reference[: RATE // 2], mode="valid")))
    aligned = decoded[lag : lag + len(reference)]
    n = min(len(aligned), len(reference))
    # Compared below 11 kHz: the 24 <-> 48 kHz resamplers' transition band lies above it.
    expected, got = _low_pass(reference[:n], 11_000), _low_pass(aligned[:n], 11_000)
    snr_db = 10 * np.log10(np.sum(expected**2) / np.sum((expected - got) ** 2))
    assert snr_db >= 20, snr_db


async def test_bad_input_gets_error_events_and_the_session_lives_on(server: Server, speech: np.ndarray) -> None:
    bad = [
        ("{not json", "invalid_json"),
        (json.dumps({"type": "conversation.teleport"}), "unknown_event"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": 12, "event_id": "evt_types"}), "invalid_value"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": "!!not base64!!"}), "invalid_value"),
        (json.dumps({"type": "conversation.item.truncate", "item_id": "x", "content_index": "zero", "audio_end_ms": 5}),
         "invalid_value"),
        (json.dumps({"type": "input_audio_buffer.commit", "event_id": "evt_empty"}), "input_audio_buffer_commit_empty"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(16 * 1024 * 1024)).decode()}),
         "message_too_large"),
    ]
    async with websockets.connect(_ws_url(server), max_size=None) as ws:
        await ws.recv()
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime",
                                  "audio": {"input": {"turn_detection": None}}}}))
        assert json.loads(await ws.recv())["type"] == "session.updated"
        for message, code in bad:
            await ws.send(message)
            event = json.loads(await ws.recv())
            assert event["type"] == "error", event
            assert event["error"]["code"] == code, event
        events, _ = await _raw_turn(ws, speech)
    assert events[-1]["response"]["status"] == "completed"


async def test_thirty_two_concurrent_sessions_each_complete_a_turn(server: Server, speech: np.ndarray) -> None:
    """Twice as many turns at once as the tiny profile runs (16): the rest wait for a place, those that wait past
    `admission.live_queue_timeout_s` are refused as overloaded, and a session that asks again once told so is
    answered; nothing else goes wrong."""

    async def one_turn(client: AsyncOpenAI) -> tuple[str, int]:
        async with client.realtime.connect(model="tiny") as conn:
            await conn.recv()
            await append_audio(conn, np.concatenate([silence(0.2), speech[: RATE], silence(0.8)]), chunk_s=0.25)
            refusals = 0
            while True:
                events = await events_until(conn, "response.done", timeout_s=240)
                assert not [e for e in events if e.type == "error"]
                response = events[-1].response
                if response.status != "failed":
                    return response.status, refusals
                assert response.status_details.error.code == "server_overloaded", response
                refusals += 1
                assert refusals < 30
                await asyncio.sleep(1)  # the refusal's Retry-After
                await conn.response.create()

    async with client_for(server) as client:
        outcomes = await asyncio.gather(*(one_turn(client) for _ in range(32)))
    assert [status for status, _ in outcomes] == ["completed"] * 32
    assert sum(1 for _, refusals in outcomes if refusals == 0) >= 16  # a full batch went at once


async def test_g711_input_completes_a_turn(server: Server, speech: np.ndarray) -> None:
    from voice_gateway.audio.g711 import ulaw_encode

    narrow = resample(speech, RATE, 8000)
    async with client_for(server) as client, client.realtime.connect(model="tiny") as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "audio": {"input": {
            "format": {"type": "audio/pcmu"}, "turn_detection": None}}})
        await events_until(conn, "session.updated")
        await conn.input_audio_buffer.append(audio=base64.b64encode(ulaw_encode(narrow)).decode())
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        events = await events_until(conn, "response.done")
    committed = next(e for e in events if e.type == "conversation.item.added" and e.item.role == "user")
    assert committed.item.content[0].type == "input_audio"
    assert events[-1].response.status == "completed"
    # the Thinker heard it: ~13 audio tokens per second of speech
    assert events[-1].response.usage.input_token_details.audio_tokens >= 13 * len(speech) // RATE


@pytest.fixture(scope="module")
def guarded_server(tiny_checkpoint: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    proc, srv = start_server(cache_dir, tmp_path_factory.mktemp("guarded") / "server.log",
                             "--max-sessions", "1", "--api-key", "sesame")
    yield srv
    stop_server(proc)


async def test_api_key_and_session_limit_are_clear_refusals(guarded_server: Server) -> None:
    url = _ws_url(guarded_server)
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(url):
            pass
    assert refused.value.response.status_code == 403  # closed before accept: no key
    # browsers cannot set headers: the key may come as a subprotocol
    async with websockets.connect(url, subprotocols=["realtime", "openai-insecure-api-key.sesame"]) as first:
        assert json.loads(await first.recv())["type"] == "session.created"
        async with websockets.connect(url, additional_headers={"Authorization": "Bearer sesame"}) as second:
            error = json.loads(await second.recv())
            assert error["type"] == "error" and error["error"]["code"] == "too_many_sessions"
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await second.recv()
            assert closed.value.rcvd.code == 1013
    health = guarded_server.get("/health").json()
    assert health["active_sessions"] == 0
