"""A request that an engine replica refuses before any output goes once to another replica: two tiny
replicas on Ray that run one reply each and queue none, and a conversation's next turn sent by its
affinity to the replica that is busy. One that every replica refuses still ends refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from engine import (
    OVERLOADED,
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
pytestmark = pytest.mark.asyncio(loop_scope="module")

OVERRIDES = {
    "engine": {"where": "ray", "replicas": {"count": 2, "address": "local", "cpus": 1}},
    "admission": {"max_active": 1, "max_queued": 0},
    "stages": {"thinker": {"ignore_eos": True}, "talker": {"max_frames": 12}},
}
FIRST = Message("user", (TextPart("tell me about the sea and the ships that sail on it " * 8),))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tiny_checkpoint: Path, cache_dir: Path) -> AsyncIterator[Engine]:
    engine = create_engine("tiny", load_profile(model="tiny", platform="cpu", overrides=OVERRIDES), cache_dir)
    await engine.start()
    yield engine
    await engine.stop()


def _request(rid: str, *messages: Message, max_tokens: int = 4) -> EngineRequest:
    return EngineRequest(rid, messages or (Message("user", (TextPart(f"hello {rid}"),)),),
                         sampling=SamplingParams(max_tokens=max_tokens, seed=1))


async def _drain(stream) -> list[OutputEvent]:
    return [event async for event in stream]


async def test_a_refused_turn_is_retried_on_the_other_replica(engine: Engine) -> None:
    replicas = engine.core  # type: ignore[attr-defined]  # the ReplicaSet behind the front end
    first = await _drain(await engine.submit(_request("turn1", FIRST)))
    assert isinstance(first[-1], Finished), first[-1]
    # both idle: replica 0 runs the long reply, and is full
    busy = await engine.submit(_request("busy", max_tokens=400))
    assert replicas.routed()["busy"] == "0"
    assert not isinstance(await busy.__anext__(), Failed)
    reply = "".join(e.text for e in first if isinstance(e, TextDelta))
    # turn 2's affinity is replica 0, which refuses it; replica 1 runs it
    second = await engine.submit(_request("turn2", FIRST, Message("assistant", (TextPart(reply),)),
                                          Message("user", (TextPart("and then?"),))))
    assert replicas.routed()["turn2"] == "0"
    events = [await second.__anext__()]
    assert replicas.routed()["turn2"] == "1"
    events += await _drain(second)
    assert isinstance(events[-1], Finished), events[-1]
    assert not any(isinstance(e, Failed) for e in events), events
    # both full now: one more is refused by both, and says so
    other = await engine.submit(_request("other", max_tokens=400))
    assert replicas.routed()["other"] == "1"
    assert not isinstance(await other.__anext__(), Failed)
    refused = await _drain(await engine.submit(_request("refused")))
    assert len(refused) == 1 and isinstance(refused[0], Failed) and refused[0].code == OVERLOADED, refused
    await busy.aclose()
    await other.aclose()
