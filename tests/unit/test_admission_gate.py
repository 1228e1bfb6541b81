"""Admission control on the tiny engine: replies beyond the stages' batch, or beyond the room their KV pools hold,
wait in a bounded queue with a deadline (a longer one for a turn of a live conversation), or are refused at once as
overloaded; a place that frees goes to the longest waiting."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from engine import (
    OVERLOADED,
    AudioChunk,
    Engine,
    EngineRequest,
    Failed,
    Finished,
    Message,
    SamplingParams,
    TextPart,
    create_engine,
    load_profile,
)
from engine.gate import Gate
from engine.omni.backend import OmniBackend
from engine.omni.weights.source import ModelSource


def _engine(cache_dir: Path, *, batch: int, max_queued: int, queue_timeout_s: float, kv_tokens: int = 0,
            live_queue_timeout_s: float = 5.0) -> Engine:
    admission = {"max_queued": max_queued, "queue_timeout_s": queue_timeout_s,
                 "live_queue_timeout_s": live_queue_timeout_s}
    profile = load_profile(model="tiny", platform="cpu", overrides={"admission": admission},
                           stage_overrides={"thinker": {"max_batch": batch, "ignore_eos": True,
                                                        "kv_cache_tokens": kv_tokens},
                                            "talker": {"ignore_eos": True}})
    assert OmniBackend(ModelSource.open("tiny", cache_dir=cache_dir), profile).capacity == batch
    return create_engine("tiny", profile, cache_dir)


def _request(rid: str, *, audio: bool, max_tokens: int = 4, live_turn: bool = False) -> EngineRequest:
    # a spoken reply of the tiny model's 48 frames takes seconds on a CPU, a text reply of 4 tokens far less
    return EngineRequest(rid, (Message("user", (TextPart("hello"),)),), want_audio=audio,
                         sampling=SamplingParams(max_tokens=max_tokens, seed=0), live_turn=live_turn)


async def _outcome(engine: Engine, request: EngineRequest) -> list:
    return [event async for event in await engine.submit(request)]


async def _holding_the_place(engine: Engine, gate: Gate) -> asyncio.Task:
    """A spoken reply (seconds on a CPU) started and running: with one place, it holds it."""
    long = asyncio.create_task(_outcome(engine, _request("long", audio=True)))
    while not gate._active:
        await asyncio.sleep(0.01)
    return long


def _refused(events: list) -> bool:
    return len(events) == 1 and isinstance(events[0], Failed) and events[0].code == OVERLOADED


async def test_past_the_queue_a_request_is_refused_at_once_and_the_queued_one_runs_later(
        tiny_checkpoint: Path, cache_dir: Path) -> None:
    engine = _engine(cache_dir, batch=2, max_queued=1, queue_timeout_s=120)
    await engine.start()
    try:
        gate = engine.core  # type: ignore[attr-defined]
        assert isinstance(gate, Gate)
        assert gate.live_queue_timeout_s == 120  # a live turn never waits less than a request (5 s here)
        running = [asyncio.create_task(_outcome(engine, _request(f"run{i}", audio=True))) for i in range(2)]
        while len(gate._active) < 2:
            await asyncio.sleep(0.01)
        queued = asyncio.create_task(_outcome(engine, _request("queued", audio=False)))
        while not gate._waiting:
            await asyncio.sleep(0.01)
        refused = await asyncio.wait_for(_outcome(engine, _request("refused", audio=False)), timeout=5)
        assert _refused(refused), refused
        assert refused[0].retry_after_s and refused[0].retry_after_s >= 1
        assert not queued.done() and not any(t.done() for t in running)  # it refused without waiting for them
        for task in (*running, queued):
            events = await asyncio.wait_for(task, timeout=120)
            assert isinstance(events[-1], Finished), events[-1]
        assert gate.metrics.wait._sum.get() > 0  # the queued one waited for a running one to end
        assert not gate._active and not gate._waiting
    finally:
        await engine.stop()


async def test_a_queued_request_is_refused_when_its_deadline_passes_and_an_aborted_one_never_runs(
        tiny_checkpoint: Path, cache_dir: Path) -> None:
    engine = _engine(cache_dir, batch=1, max_queued=2, queue_timeout_s=0.3)
    await engine.start()
    try:
        gate = engine.core  # type: ignore[attr-defined]
        long = await _holding_the_place(engine, gate)
        abandoned = await engine.submit(_request("abandoned", audio=False))
        await abandoned.aclose()
        assert not gate._waiting
        timed_out = await asyncio.wait_for(_outcome(engine, _request("late", audio=False)), timeout=10)
        assert _refused(timed_out) and "within 0.3 s" in timed_out[0].reason
        events = await asyncio.wait_for(long, timeout=120)
        assert isinstance(events[-1], Finished) and any(isinstance(e, AudioChunk) for e in events)
        assert gate.metrics.refused.labels("timeout")._value.get() == 1
        # the aborted one took no place: a new request runs at once
        assert isinstance((await _outcome(engine, _request("after", audio=False)))[-1], Finished)
    finally:
        await engine.stop()


async def test_replies_past_the_thinkers_pool_wait_for_room_though_slots_are_free(
        tiny_checkpoint: Path, cache_dir: Path) -> None:
    # a pool of one whole context (1,024 positions, four pages): a reply that may run to 300 tokens reserves two
    engine = _engine(cache_dir, batch=8, max_queued=1, queue_timeout_s=120, kv_tokens=1024)
    await engine.start()
    try:
        gate = engine.core  # type: ignore[attr-defined]
        assert gate.pools is not None and gate.pools.thinker_positions == 1024
        running = [asyncio.create_task(_outcome(engine, _request(f"run{i}", audio=True, max_tokens=300)))
                   for i in range(2)]
        while len(gate._active) < 2:
            await asyncio.sleep(0.01)
        queued = asyncio.create_task(_outcome(engine, _request("queued", audio=False, max_tokens=300)))
        while not gate._waiting:
            await asyncio.sleep(0.01)
        assert len(gate._active) == 2  # six of its eight slots free, but no room for a third reply's 300 tokens
        refused = await asyncio.wait_for(_outcome(engine, _request("refused", audio=False)), timeout=5)
        assert _refused(refused) and "holding 1,024 of 1,024 Thinker positions" in refused[0].reason, refused
        for task in (*running, queued):
            events = await asyncio.wait_for(task, timeout=300)
            assert isinstance(events[-1], Finished), events[-1]
        assert not gate._active and gate._held == (0, 0)
        # short replies take a page each: four at once
        shorts = await asyncio.gather(*(_outcome(engine, _request(f"short{i}", audio=False)) for i in range(4)))
        assert all(isinstance(events[-1], Finished) for events in shorts)
    finally:
        await engine.stop()


async def test_a_live_turn_waits_past_the_queue_timeout_for_a_place_where_a_request_is_refused(
        tiny_checkpoint: Path, cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    engine = _engine(cache_dir, batch=1, max_queued=2, queue_timeout_s=0.2, live_queue_timeout_s=120)
    await engine.start()
    try:
        gate = engine.core  # type: ignore[attr-defined]
        long = await _holding_the_place(engine, gate)
        live = asyncio.create_task(_outcome(engine, _request("live", audio=False, live_turn=True)))
        while not gate._waiting:
            await asyncio.sleep(0.01)
        plain = await asyncio.wait_for(_outcome(engine, _request("plain", audio=False)), timeout=10)
        assert _refused(plain) and "no place for this request within 0.2 s" in plain[0].reason, plain
        assert not long.done() and list(gate._waiting) == ["live"]  # past the plain deadline, it still waits
        with caplog.at_level(logging.INFO, logger="engine.gate"):
            events = await asyncio.wait_for(live, timeout=120)
        assert isinstance(events[-1], Finished), events[-1]
        assert long.done() and isinstance(long.result()[-1], Finished)  # it ran once the spoken reply ended
        assert gate.metrics.refused.labels("timeout")._value.get() == 1
        # the spoken reply takes seconds on a CPU: the live turn's long wait is logged
        assert any("request live (a live turn) waited" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        await engine.stop()


async def test_a_live_turn_is_refused_past_its_own_deadline_and_a_request_at_once_without_one(
        tiny_checkpoint: Path, cache_dir: Path) -> None:
    engine = _engine(cache_dir, batch=1, max_queued=2, queue_timeout_s=0, live_queue_timeout_s=0.3)
    await engine.start()
    try:
        gate = engine.core  # type: ignore[attr-defined]
        long = await _holding_the_place(engine, gate)
        plain = await asyncio.wait_for(_outcome(engine, _request("plain", audio=False)), timeout=5)
        assert _refused(plain) and "at capacity (1 replies running" in plain[0].reason, plain
        live = await asyncio.wait_for(_outcome(engine, _request("live", audio=False, live_turn=True)), timeout=10)
        assert _refused(live), live
        assert "no place for this turn of a live conversation within 0.3 s" in live[0].reason, live
        assert live[0].retry_after_s and live[0].retry_after_s >= 1
        assert not long.done()  # refused on its deadline, not for a place that freed
        assert gate.metrics.refused.labels("full")._value.get() == 1
        assert gate.metrics.refused.labels("timeout")._value.get() == 1
        assert isinstance((await asyncio.wait_for(long, timeout=120))[-1], Finished)
    finally:
        await engine.stop()
