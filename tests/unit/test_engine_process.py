"""The engine in its own process (`engine: process`) answers as the in-process engine does: the same
events for the same seed, the same refusals, aborts, metrics. A child that dies or stalls fails what
it held with `engine_unavailable`, refuses new requests the same way, and is replaced."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from engine import (
    UNAVAILABLE,
    AudioChunk,
    AudioPart,
    EngineError,
    EngineRequest,
    Failed,
    Finished,
    ImagePart,
    Message,
    SamplingParams,
    TextDelta,
    TextPart,
    create_engine,
    load_profile,
)
from engine.handoff import AdmittedRequest
from engine.remote import client as client_module
from engine.remote.client import RemoteCore
from engine.remote.messages import Submit


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


def _reaped(pid: int) -> bool:
    """Gone for good: not running, and no zombie left behind."""
    return not Path(f"/proc/{pid}").exists()


def _release(pid: int | None) -> None:
    """A test that failed may leave its child stopped: let it go."""
    if pid is not None and not _reaped(pid):
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def _supervised(**supervision) -> object:
    return load_profile(model="tiny", platform="cpu", overrides={"engine": {"where": "process", "supervision": supervision}})


async def _held(engine, rid: str):
    """A request still running, its first output in hand."""
    stream = await engine.submit(dataclasses.replace(_request(rid), sampling=SamplingParams(max_tokens=500)))
    assert isinstance(await stream.__anext__(), (TextDelta, AudioChunk))
    return stream


async def _end(stream) -> Failed:
    events = [event async for event in stream]
    assert isinstance(events[-1], Failed), events[-1]
    return events[-1]


def _samples(engine) -> dict[tuple[str, str], float]:
    text = generate_latest(engine.registry).decode()
    return {(s.name, s.labels.get("cause", "")): s.value for f in text_string_to_metric_families(text) for s in f.samples}


async def test_engine_process_serves_as_the_engine_in_process(tiny_checkpoint: Path, cache_dir: Path) -> None:
    profile = load_profile(model="tiny", platform="cpu")
    local = create_engine("tiny", profile, cache_dir)
    await local.start()
    try:
        expected = await _reply(local, _request("local"))
    finally:
        await local.stop()

    remote = create_engine("tiny", load_profile(model="tiny", platform="cpu", overrides={"engine": {"where": "process"}}),
                           cache_dir)
    core = remote.core
    assert isinstance(core, RemoteCore)
    await remote.start()
    pid = core.pid
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
        # each request the child began (the reply and the aborted one; the refusals never left), timed from its send
        assert pushed["engine_request_crossing_seconds_count"] == 2
        assert 0 < pushed["engine_request_crossing_seconds_sum"] < 2 * 5.0
    finally:
        await remote.stop()
    assert pid is not None and _reaped(pid)


async def test_a_killed_engine_process_fails_its_requests_and_is_restarted(tiny_checkpoint: Path,
                                                                           cache_dir: Path) -> None:
    engine = create_engine("tiny", _supervised(restart_backoff_s=0.5), cache_dir)
    await engine.start()
    first = engine.core.pid
    try:
        assert engine.health().status == "ok" and _samples(engine)[("engine_process_up", "")] == 1
        held = await _held(engine, "held")
        os.kill(first, signal.SIGKILL)
        failed = await asyncio.wait_for(_end(held), 30)
        assert failed.code == UNAVAILABLE and "engine process exited" in failed.reason and failed.retry_after_s >= 1

        # until the next child is ready (its start takes seconds): down, and every request a 503's refusal
        health = engine.health()
        assert health.status == "down" and "exited" in health.detail and health.retry_after_s >= 1, health
        assert engine.stage_load() == {} and _samples(engine)[("engine_process_up", "")] == 0
        with pytest.raises(EngineError, match="unavailable") as refused:
            await engine.submit(_request("during"))
        assert refused.value.code == UNAVAILABLE and refused.value.retry_after_s >= 1
        await _until(lambda: _reaped(first))

        await _until(lambda: engine.health().status == "ok", timeout_s=180)
        assert engine.health().restarts == 1 and engine.core.pid not in (None, first)
        assert (await _reply(engine, _request("after")))[0]
        samples = _samples(engine)
        assert samples[("engine_process_up", "")] == 1 and samples[("engine_process_restarts_total", "exited")] == 1
    finally:
        await engine.stop()
        _release(first)
    assert engine.health().status == "down"


async def test_a_stopped_engine_process_fails_its_requests_by_the_deadline(tiny_checkpoint: Path,
                                                                          cache_dir: Path) -> None:
    """SIGSTOP: the pipe stays open, only the heartbeat stops. Past `stall_timeout_s` its requests fail,
    and the child is killed, reaped and replaced."""
    engine = create_engine("tiny", _supervised(stall_timeout_s=5, restart_backoff_s=0.5), cache_dir)
    await engine.start()
    first = engine.core.pid
    try:
        held = await _held(engine, "held")
        os.kill(first, signal.SIGSTOP)
        await _until(lambda: engine.health().status == "degraded")  # late, from a second on: still serving
        assert "no word" in engine.health().detail
        failed = await asyncio.wait_for(_end(held), 30)
        assert failed.code == UNAVAILABLE and "stalled" in failed.reason, failed
        assert engine.health().status == "down"
        with pytest.raises(EngineError) as refused:
            await engine.submit(_request("during"))
        assert refused.value.code == UNAVAILABLE
        await _until(lambda: _reaped(first))  # killed while stopped, and waited for: no zombie

        await _until(lambda: engine.health().status == "ok", timeout_s=180)
        # one restart, or more where a loaded machine starved the new child past the deadline too
        assert engine.health().restarts >= 1
        assert (await _reply(engine, _request("after")))[0]
        assert _samples(engine)[("engine_process_restarts_total", "stalled")] >= 1
    finally:
        await engine.stop()
        _release(first)


async def test_several_server_processes_share_one_engine_process(tiny_checkpoint: Path, cache_dir: Path) -> None:
    """`EngineHost` (what `serve --http-workers N` starts): clients attach, each hears only its own replies,
    and one that leaves loses only its own requests."""
    from engine.deploy import EngineHost, attach_engine

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
    assert host.pid is not None and _reaped(host.pid)


async def test_a_server_process_started_before_its_engine_waits_for_it(tiny_checkpoint: Path, cache_dir: Path) -> None:
    """`serve --http-workers N` starts its server processes while the engine process starts: one that attaches
    first waits for the engine's socket, and one whose host gave up (the socket's folder gone) fails at once."""
    from engine.deploy import EngineHost, attach_engine

    host = EngineHost("tiny", load_profile(model="tiny", platform="cpu"), cache_dir)
    early = attach_engine(host.address)
    attaching = asyncio.create_task(early.start())
    try:
        await asyncio.sleep(0.5)
        assert not attaching.done() and not Path(host.address[0]).exists()
        await asyncio.to_thread(host.start)
        await asyncio.wait_for(attaching, 30)
        assert (await _reply(early, _request("early")))[0]
    finally:
        await early.stop()
        await asyncio.to_thread(host.stop)
    late = attach_engine(host.address)
    with pytest.raises(EngineError, match="did not start"):
        await asyncio.wait_for(late.start(), 5)


async def test_an_engine_host_replaces_its_engine_and_server_processes_reconnect(tiny_checkpoint: Path,
                                                                                cache_dir: Path) -> None:
    """`serve --http-workers N`: the host's thread replaces a child that exited or stalled at the same
    address; an attached server process fails its requests, refuses new ones, and connects again."""
    from engine.deploy import EngineHost, attach_engine

    host = EngineHost("tiny", _supervised(stall_timeout_s=5, restart_backoff_s=0.5), cache_dir)
    await asyncio.to_thread(host.start)
    worker = attach_engine(host.address)
    pids: list[int] = []
    try:
        await worker.start()
        for lose, restarts in ((signal.SIGKILL, 1), (signal.SIGSTOP, 2)):
            held = await _held(worker, f"held-{restarts}")
            pids.append(host.pid)
            os.kill(host.pid, lose)
            failed = await asyncio.wait_for(_end(held), 30)
            # stopped: the worker's own deadline, or the host's kill that its connection then sees, comes first
            assert failed.code == UNAVAILABLE, failed
            assert worker.health().status == "down"
            with pytest.raises(EngineError) as refused:
                await worker.submit(_request(f"during-{restarts}"))
            assert refused.value.code == UNAVAILABLE
            await _until(lambda: _reaped(pids[-1]))

            await _until(lambda: worker.health().status == "ok", timeout_s=180)
            assert worker.health().restarts >= restarts and host.pid not in pids  # more on a starved machine
            assert (await _reply(worker, _request(f"after-{restarts}")))[0]
    finally:
        await worker.stop()
        await asyncio.to_thread(host.stop)
        for pid in pids:
            _release(pid)
    assert _reaped(host.pid)


def _turns(n: int) -> list[tuple[Message, ...]]:
    """A spoken conversation's requests, each holding every turn before it; a picture with the first turn."""
    rng = np.random.default_rng(3)
    history: list[Message] = []
    requests = []
    for i in range(n):
        picture = (ImagePart(rng.integers(0, 256, (64, 96, 3), dtype=np.uint8)),) if i == 0 else ()
        history.append(Message("user", (AudioPart((0.1 * rng.standard_normal(8_000)).astype(np.float32)), *picture)))
        requests.append(tuple(history))
        history.append(Message("assistant", (TextPart(f"reply {i}"),)))
    return requests


async def _text(engine, rid: str, messages: tuple[Message, ...]) -> list[int]:
    request = EngineRequest(rid, messages, want_audio=False, sampling=SamplingParams(max_tokens=5, temperature=0.9,
                                                                                     seed=11))
    events = [event async for event in await engine.submit(request)]
    assert isinstance(events[-1], Finished), events[-1]
    return [t for event in events if isinstance(event, TextDelta) for t in event.token_ids]


async def test_a_conversation_sends_each_clip_and_picture_once(tiny_checkpoint: Path, cache_dir: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Each turn's request names the earlier turns' clips and pictures by key (engine/remote/media.py); an
    engine that lacks one asks for the request whole; the replies are the in-process engine's."""
    turns = _turns(3)
    local = create_engine("tiny", load_profile(model="tiny", platform="cpu"), cache_dir)
    await local.start()
    try:
        expected = [await _text(local, f"t{i}", messages) for i, messages in enumerate(turns)]
    finally:
        await local.stop()

    submits: list[AdmittedRequest] = []
    send = client_module.send
    monkeypatch.setattr(client_module, "send",
                        lambda conn, message: (isinstance(message, Submit) and submits.append(message.request),
                                               send(conn, message))[1])
    in_a_process = load_profile(model="tiny", platform="cpu", overrides={"engine": {"where": "process"}})
    remote = create_engine("tiny", in_a_process, cache_dir)
    await remote.start()
    try:
        got = [await _text(remote, f"t{i}", messages) for i, messages in enumerate(turns)]
        assert [[mel is None for mel in s.audio_features] for s in submits] == [[False], [True, False],
                                                                                [True, True, False]]
        assert [[image.pixels is None for image in s.images] for s in submits] == [[False], [True], [True]]
        # a clip the engine never got (as if it had let it go): it asks, and the request goes again whole
        fourth = (*turns[2], Message("assistant", (TextPart("reply 2"),)), Message("user", (TextPart("and?"),)))
        extra = dataclasses.replace(turns[0][0], content=(AudioPart(np.full(8_000, 0.05, dtype=np.float32)),))
        core = remote.core
        prompt = remote.intake.prompts.build((extra,))
        core._media._sent.add(prompt.audio_keys[0], True, 0)  # believed sent, never sent
        resent = await _text(remote, "t3", (extra, *fourth))
        assert [mel is None for mel in submits[-2].audio_features][0] and submits[-1].audio_features[0] is not None
    finally:
        await remote.stop()
    assert got == expected
    local = create_engine("tiny", load_profile(model="tiny", platform="cpu"), cache_dir)
    await local.start()
    try:
        assert resent == await _text(local, "t3", (extra, *fourth))
    finally:
        await local.stop()
