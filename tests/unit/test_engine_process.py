"""The engine in its own process (`engine: process`) answers as the in-process engine does: the same
events for the same seed, the same refusals, aborts, metrics; and a child that dies fails what it held."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from engine import (
    AudioChunk,
    EngineError,
    EngineRequest,
    Failed,
    Finished,
    Message,
    SamplingParams,
    TextDelta,
    TextPart,
    create_engine,
    load_profile,
)
from engine.remote.client import RemoteCore


def _request(rid: str, text: str = "tell me about the sea", **kwargs) -> EngineRequest:
    sampling = SamplingParams(max_tokens=6, temperature=0.9, seed=7)
    return EngineRequest(rid, (Message("user", (TextPart(text),)),), sampling=sampling, **kwargs)


async def _reply(engine, request: EngineRequest) -> tuple[list[int], np.ndarray, Finished]:
    tokens: list[int] = []
    audio: list[np.ndarray] = []
    events = [event async for event in await engine.submit(request)]
    for event in events:
        if isinstance(event, TextDelta):
            tokens += event.token_ids
        elif isinstance(event, AudioChunk):
            audio.append(event.samples)
    assert isinstance(events[-1], Finished), events[-1]
    return tokens, np.concatenate(audio), events[-1]


async def _until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_engine_process_serves_as_the_engine_in_process(tiny_checkpoint: Path, cache_dir: Path) -> None:
    profile = load_profile(model="tiny", platform="cpu")
    local = create_engine("tiny", profile, cache_dir)
    await local.start()
    try:
        expected = await _reply(local, _request("local"))
    finally:
        await local.stop()

    remote = create_engine("tiny", dataclasses.replace(profile, engine="process"), cache_dir)
    core = remote.core
    assert isinstance(core, RemoteCore)
    await remote.start()
    try:
        assert remote.info == local.info
        tokens, audio, finished = await _reply(remote, _request("remote"))
        assert tokens == expected[0] and len(tokens) == 6
        assert np.array_equal(audio, expected[1]) and audio.size > 0
        assert finished.timings.codec_frames == expected[2].timings.codec_frames

        # refusals come back as the engine's own errors
        with pytest.raises(EngineError, match="unknown voice"):
            await remote.submit(_request("bad-voice", speaker="nobody"))
        with pytest.raises(EngineError) as too_long:
            await remote.submit(_request("too-long", text="sea " * 3000))
        assert too_long.value.code == "context_length_exceeded"
        assert remote.num_active_requests() == 0

        # closing a stream early aborts the request in the child
        stream = await remote.submit(dataclasses.replace(_request("aborted"), sampling=SamplingParams(max_tokens=200)))
        assert isinstance(await stream.__anext__(), (TextDelta, AudioChunk))
        await stream.aclose()
        await _until(lambda: remote.num_active_requests() == 0 and not any(remote.stage_load().values()))

        # the child's metrics reach the parent's registry
        await _until(lambda: b'engine_requests_total{outcome="aborted"} 1.0' in generate_latest(remote.registry))
        pushed = {sample.name: sample.value for family in text_string_to_metric_families(
            generate_latest(remote.registry).decode()) for sample in family.samples}
        assert pushed["engine_ttft_seconds_count"] == 2 and pushed["engine_ttfp_seconds_count"] >= 1
    finally:
        await remote.stop()
    assert core._process is not None and not core._process.is_alive()


async def test_a_dead_engine_process_fails_its_requests(tiny_checkpoint: Path, cache_dir: Path) -> None:
    profile = dataclasses.replace(load_profile(model="tiny", platform="cpu"), engine="process")
    engine = create_engine("tiny", profile, cache_dir)
    await engine.start()
    try:
        stream = await engine.submit(dataclasses.replace(_request("held"), sampling=SamplingParams(max_tokens=500)))
        engine.core._process.kill()
        events = [event async for event in stream]
        assert isinstance(events[-1], Failed) and "engine process exited" in events[-1].reason
        with pytest.raises(EngineError, match="not running"):
            await engine.submit(_request("after"))
    finally:
        await engine.stop()


async def test_several_server_processes_share_one_engine_process(tiny_checkpoint: Path, cache_dir: Path) -> None:
    """`EngineHost` (what `serve --http-workers N` starts): clients attach, each hears only its own replies,
    and one that leaves loses only its own requests."""
    from engine import EngineHost, attach_engine

    host = EngineHost("tiny", load_profile(model="tiny", platform="cpu"), cache_dir)
    await asyncio.to_thread(host.start)
    assert Path(host.address[0]).exists()  # ready means attachable: the socket listens before Ready is sent
    first, second = (attach_engine(host.address) for _ in range(2))
    try:
        await first.start()
        await second.start()
        assert first.info == second.info and first.core.spec == second.core.spec
        (one, _, done_one), (two, _, done_two) = await asyncio.gather(_reply(first, _request("a")),
                                                                      _reply(second, _request("b")))
        assert one == two and len(one) == 6  # the same seed: the same reply, on each its own connection
        assert (done_one.request_id, done_two.request_id) == ("a", "b")

        held = await first.submit(dataclasses.replace(_request("held"), sampling=SamplingParams(max_tokens=500)))
        assert isinstance(await held.__anext__(), (TextDelta, AudioChunk))
        await first.stop()  # this server process leaves: the engine drops its request and serves on
        await _until(lambda: not any(second.stage_load().values()))
        assert (await _reply(second, _request("c")))[0] == one
    finally:
        await first.stop()
        await second.stop()
        await asyncio.to_thread(host.stop)
    assert not host._process.is_alive()
