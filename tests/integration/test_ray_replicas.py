"""Two tiny engines as Ray actors, each in its own process, behind one engine: requests spread over both,
a conversation's turns stick to the replica that keeps its prefix, and a replica whose process is
killed is survived (its request fails with engine_unavailable, new work goes to the other, Ray starts
it again and it serves again). Ray is started here (`address: local`) and stopped at the end."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from engine import (
    UNAVAILABLE,
    AudioPart,
    Engine,
    EngineRequest,
    Failed,
    Finished,
    Message,
    OutputEvent,
    SamplingParams,
    TextDelta,
    TextPart,
    create_engine,
    load_profile,
)

pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'voice-gateway[ray]')")
# the engine's tasks (each replica's poll) run on the loop it started on: the tests share it
pytestmark = pytest.mark.asyncio(loop_scope="module")

OVERRIDES = {
    "engine": {"where": "ray", "replicas": {"count": 2, "address": "local", "cpus": 1}},
    "stages": {"thinker": {"ignore_eos": True}, "talker": {"max_frames": 12}},
}
# a spoken question, as a realtime session sends it; long enough that turn 2's common prefix passes the
# prefix cache's minimum (64 tokens)
TONE = (0.2 * np.sin(np.arange(16_000) * 0.05)).astype(np.float32)
FIRST = Message("user", (AudioPart(TONE), TextPart("tell me about the sea and the ships that sail on it " * 4)))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tiny_checkpoint: Path, cache_dir: Path) -> AsyncIterator[Engine]:
    profile = load_profile(model="tiny", platform="cpu", overrides=OVERRIDES)
    engine = create_engine("tiny", profile, cache_dir)
    await engine.start()
    yield engine
    await engine.stop()


def _replicas(engine: Engine):
    return engine.core  # type: ignore[attr-defined]  # the ReplicaSet behind the front end


def _request(rid: str, *messages: Message, max_tokens: int = 4, audio: bool = False) -> EngineRequest:
    return EngineRequest(rid, messages or (Message("user", (TextPart(f"hello {rid}"),)),), want_audio=audio,
                         sampling=SamplingParams(max_tokens=max_tokens, seed=1))


async def _drain(stream) -> list[OutputEvent]:
    return [event async for event in stream]


async def test_requests_spread_over_both_replicas(engine: Engine) -> None:
    streams = [await engine.submit(_request(f"spread{i}")) for i in range(4)]
    routed = _replicas(engine).routed()
    assert sorted(routed.values()) == ["0", "0", "1", "1"], routed
    for events in await asyncio.gather(*(_drain(s) for s in streams)):
        assert isinstance(events[-1], Finished), events[-1]
    await asyncio.sleep(1.0)  # a poll or two: the replicas' figures as they report them
    text = generate_latest(engine.registry).decode()
    # each replica's engine families, labelled by replica
    for replica in ("0", "1"):
        assert f'engine_requests_total{{outcome="completed",replica="{replica}"}} 2.0' in text, text
    assert 'engine_replica_up{replica="0"} 1.0' in text and 'engine_replica_up{replica="1"} 1.0' in text


async def test_a_conversation_sticks_to_the_replica_that_keeps_its_prefix(engine: Engine) -> None:
    # replica 0 busy: turn 1 goes to replica 1
    busy = await engine.submit(_request("busy", max_tokens=8))
    first_stream = await engine.submit(_request("turn1", FIRST))
    assert _replicas(engine).routed()["turn1"] == "1"
    first = await _drain(first_stream)
    await _drain(busy)
    reply = "".join(e.text for e in first if isinstance(e, TextDelta))
    # both idle now: least loaded alone would pick replica 0; the conversation goes back to replica 1
    second_stream = await engine.submit(_request("turn2", FIRST, Message("assistant", (TextPart(reply),)),
                                                 Message("user", (TextPart("and then?"),))))
    assert _replicas(engine).routed()["turn2"] == "1"
    second = await _drain(second_stream)
    assert isinstance(second[-1], Finished), second[-1]
    assert isinstance(first[-1], Finished)
    # its KV was there: turn 2 prefilled only what is new
    assert second[-1].timings.cached_tokens >= first[-1].timings.prompt_tokens


async def test_a_server_process_that_leaves_has_its_requests_aborted(engine: Engine) -> None:
    """A server process holds one connection to each replica's channel and submits on it. When it goes
    away the replica aborts what it still had open; every connection's state says so."""
    from multiprocessing.connection import Client

    from engine.handoff import AdmittedRequest
    from engine.remote.messages import Events, Ready, State, Submit
    from engine.remote.pipe import portable

    channel = await _replicas(engine).replicas[1].reach.actor.ready.remote()
    leaving = portable(await asyncio.to_thread(Client, channel.address, authkey=channel.authkey))
    watching = portable(await asyncio.to_thread(Client, channel.address, authkey=channel.authkey))
    assert isinstance(leaving.recv(), Ready) and isinstance(watching.recv(), Ready)
    long = AdmittedRequest("left-behind", list(range(100, 140)), [], 0, [], False, "ethan", 200, 0.7, 0.8, 20, 1)
    leaving.send(Submit(long))
    seen: list[OutputEvent] = []
    while not seen:
        message = await asyncio.to_thread(leaving.recv)
        if isinstance(message, Events):
            seen += [event for event in message.events if event.request_id == "left-behind"]
        elif isinstance(message, State):
            assert message.received in (0, 1), message  # made before or after the submit came
    assert not isinstance(seen[-1], (Finished, Failed)), seen  # still running

    async def open_requests_reach(n: int) -> float:
        """Once the replica says it runs `n` requests: how many it has aborted."""
        deadline = time.monotonic() + 30
        while True:
            message = await asyncio.to_thread(watching.recv)
            if isinstance(message, State) and message.open_requests == n:
                assert message.received == 0, message  # the watcher's own submits: none
                aborted = [s.value for f in text_string_to_metric_families(message.metrics_text) for s in f.samples
                           if s.name == "engine_requests_total" and s.labels == {"outcome": "aborted"}]
                return sum(aborted)
            assert time.monotonic() < deadline, f"the replica's open requests never reached {n}"

    aborted_before = await open_requests_reach(1)
    leaving.close()
    # not finished: aborted, as the process left
    assert await open_requests_reach(0) == aborted_before + 1
    watching.close()


async def test_a_killed_replica_is_survived_and_comes_back(engine: Engine) -> None:
    replicas = _replicas(engine)
    victim = await engine.submit(_request("victim", max_tokens=200, audio=True))
    assert replicas.routed()["victim"] == "0"
    first = await victim.__anext__()
    assert not isinstance(first, Failed), first
    pid = replicas.replicas[0].pid
    os.kill(pid, signal.SIGKILL)
    events = await asyncio.wait_for(_drain(victim), 30)
    assert isinstance(events[-1], Failed) and events[-1].code == UNAVAILABLE, events[-1]
    assert engine.health().status == "degraded", engine.health()
    # new work goes to the replica that serves
    events = await _drain(await engine.submit(_request("meanwhile")))
    assert isinstance(events[-1], Finished), events[-1]
    # Ray starts it again; once it answers, it is back in the rotation
    deadline = time.monotonic() + 120
    while engine.health().status != "ok":
        assert time.monotonic() < deadline, engine.health()
        await asyncio.sleep(0.5)
    assert replicas.replicas[0].restarts == 1
    streams = [await engine.submit(_request(f"after{i}")) for i in range(2)]
    assert sorted(replicas.routed().values()) == ["0", "1"]
    for events in await asyncio.gather(*(_drain(s) for s in streams)):
        assert isinstance(events[-1], Finished), events[-1]
