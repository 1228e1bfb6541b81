"""A realtime session's memory: stored audio stays within its bounds, and a closed session is freed at once."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import tracemalloc
import weakref
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from engine import INPUT_SAMPLE_RATE_HZ, Engine, create_engine, load_profile
from voice_gateway.config import GatewayConfig
from voice_gateway.metrics import GatewayMetrics
from voice_gateway.realtime.events import Dialect
from voice_gateway.realtime.frames import deliver
from voice_gateway.realtime.session import Session

INPUT_RATE_HZ = 24_000  # PCM16 input, the session's default format
BYTES_PER_STORED_S = INPUT_SAMPLE_RATE_HZ * 4  # float32 at 16 kHz

# one started engine for the module, on the module's event loop
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tiny_checkpoint: Path, cache_dir: Path) -> AsyncIterator[Engine]:
    engine = create_engine("tiny", load_profile(model="tiny", platform="cpu"), cache_dir)
    await engine.start()
    yield engine
    await engine.stop()


@pytest.fixture
def no_cyclic_gc() -> Iterator[None]:
    """Only reference counting frees anything while the test runs."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _drain(session: Session) -> list[dict]:
    out = []
    while (payload := session.outbox.get_nowait()) is not None:
        if isinstance(payload, str):
            out.append(json.loads(payload))
    return out


def _append(seconds: float, seed: int = 0) -> str:
    noise = np.random.default_rng(seed).uniform(-0.1, 0.1, int(seconds * INPUT_RATE_HZ))
    pcm = (noise * 32767).astype("<i2").tobytes()
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})


async def _manual_session(engine: Engine, gateway: GatewayConfig) -> Session:
    session = Session(engine, gateway, Dialect.GA, GatewayMetrics(), "test")
    session.open()
    await deliver(session, json.dumps({"type": "session.update", "session": {
        "type": "realtime", "audio": {"input": {"turn_detection": None}}}}))
    _drain(session)
    return session


@pytest.mark.parametrize("max_stored_audio_s", [20.0, 600.0])  # the session's cap, then the tiny context's ~59 s
async def test_many_large_commits_keep_stored_audio_bounded(engine: Engine, max_stored_audio_s: float) -> None:
    session = await _manual_session(engine, GatewayConfig(max_stored_audio_s=max_stored_audio_s))
    bound_s = min(max_stored_audio_s, session.conversation.context_audio_s())
    append = _append(15.0)
    tracemalloc.start()
    try:
        for _ in range(30):  # 450 s committed: 29 MB of stored audio without a bound
            await deliver(session, append)
            await deliver(session, json.dumps({"type": "input_audio_buffer.commit"}))
            assert session.conversation.audio_samples() <= bound_s * INPUT_SAMPLE_RATE_HZ
        held_bytes = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held_bytes < bound_s * BYTES_PER_STORED_S + 4 * 1024 * 1024, held_bytes
    items = session.conversation.items
    assert len(items) == 30 and all(item.audio_ms > 14_900 for item in items)  # the resampler holds back ~15 ms
    kept = [item for item in items if item.audio is not None]
    assert kept and kept == items[-len(kept):], "the oldest audio goes first"
    assert all(item.audio_dropped for item in items[:-len(kept)])
    events = _drain(session)
    assert [e for e in events if e["type"] == "error"] == []
    # every item was announced as the audio it was, dropped or not
    added = [e["item"] for e in events if e["type"] == "conversation.item.added"]
    assert len(added) == 30 and all(a["content"][0]["type"] == "input_audio" for a in added)


async def test_a_commit_longer_than_a_session_keeps_is_an_error_and_stays_listed(engine: Engine) -> None:
    session = await _manual_session(engine, GatewayConfig(max_stored_audio_s=10.0))
    await deliver(session, _append(12.0))
    await deliver(session, json.dumps({"type": "input_audio_buffer.commit", "event_id": "evt_long"}))
    events = _drain(session)
    assert [e["type"] for e in events] == ["input_audio_buffer.committed", "conversation.item.added",
                                           "conversation.item.done", "error"]
    error = events[-1]["error"]
    assert error["code"] == "input_audio_too_long" and error["event_id"] == "evt_long", error
    assert "at most 10 s" in error["message"] and events[0]["item_id"] in error["message"]
    item = session.conversation.items[0]
    assert item.audio is None and item.audio_ms > 11_900
    # the session goes on: a commit that fits keeps its audio
    await deliver(session, _append(2.0))
    await deliver(session, json.dumps({"type": "input_audio_buffer.commit"}))
    assert not [e for e in _drain(session) if e["type"] == "error"]
    latest = session.conversation.items[-1].audio
    assert latest is not None and session.conversation.audio_samples() == latest.size


async def _used_session(engine: Engine, response: str | None) -> Session:
    """A session with committed audio and, if asked, a response that `finished` or is still `running`."""
    session = await _manual_session(engine, GatewayConfig())
    await deliver(session, _append(3.0))
    await deliver(session, json.dumps({"type": "input_audio_buffer.commit"}))
    await deliver(session, _append(1.0, seed=1))  # left in the input buffer
    if response is not None:
        await deliver(session, json.dumps({"type": "response.create", "response": {"max_output_tokens": 4}}))
        assert session.response is not None and session.response.task is not None
        if response == "finished":
            await asyncio.wait_for(session.response.task, 60)
        else:
            await asyncio.sleep(0)
    _drain(session)
    return session


@pytest.mark.parametrize("response", [None, "finished", "running"])
async def test_a_closed_session_is_freed_without_the_cyclic_gc(
        engine: Engine, no_cyclic_gc: None, response: str | None) -> None:
    session = await _used_session(engine, response)
    audio = session.conversation.items[0].audio
    assert audio is not None
    freed_session, freed_audio = weakref.ref(session), weakref.ref(audio)
    del audio
    await session.close()
    del session
    assert freed_session() is None
    # a cancelled request may still hold its prompt's audio for a moment (a feature thread finishing): the
    # engine lets it go by itself, with no cycle to wait for
    for _ in range(200):
        if freed_audio() is None:
            break
        await asyncio.sleep(0.05)
    assert freed_audio() is None


async def test_closing_releases_the_audio_while_the_session_is_still_held(engine: Engine) -> None:
    session = await _used_session(engine, "finished")
    audio = session.conversation.items[0].audio
    assert audio is not None
    freed_audio = weakref.ref(audio)
    del audio
    await session.close()
    assert freed_audio() is None
    assert session.conversation.audio_samples() == 0 and session.buffer.duration_ms == 0
    assert len(session.conversation.items) == 2  # still listed: the user's audio item and the reply
