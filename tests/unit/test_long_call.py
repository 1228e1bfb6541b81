"""A spoken call of 60 turns on the tiny engine, through a real realtime session: the history outgrows the
context, truncation cuts it in blocks, and the turns after a cut keep reusing the cached prefix; the last
reply, made from a reused prefix, equals the reply a fresh engine makes from the whole prompt."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from engine import Engine, EngineRequest, Finished, SamplingParams, TextDelta, create_engine, load_profile
from tests.session_events import drain, send
from voice_gateway.config import GatewayConfig
from voice_gateway.metrics import GatewayMetrics
from voice_gateway.realtime.events import Dialect
from voice_gateway.realtime.frames import deliver
from voice_gateway.realtime.session import Session

pytestmark = pytest.mark.asyncio(loop_scope="session")

TURNS = 60
REPLY_TOKENS = 8
RATE = 24_000
# a context the history of ~40 tokens a turn outgrows by turn ~45
CONTEXT = 2_048


def _engine(cache_dir: Path) -> Engine:
    profile = load_profile(model="tiny", platform="cpu", stage_overrides={
        "thinker": {"max_model_len": CONTEXT, "ignore_eos": True}})
    return create_engine("tiny", profile, cache_dir)


@pytest.fixture(scope="module")
async def engines(tiny_checkpoint: Path, cache_dir: Path) -> AsyncIterator[tuple[Engine, Engine]]:
    served, fresh = _engine(cache_dir), _engine(cache_dir)
    await served.start()
    await fresh.start()
    yield served, fresh
    await served.stop()
    await fresh.stop()



def spoken(turn: int) -> str:
    """1.2 s of a tone, its pitch the turn's own, as the session's PCM16 at 24 kHz."""
    t = np.arange(int(1.2 * RATE)) / RATE
    samples = 0.3 * np.sin(2 * np.pi * (220 + 7 * turn) * t)
    return base64.b64encode((samples * 32767).astype("<i2").tobytes()).decode()


async def test_a_call_of_sixty_turns_keeps_its_cache_past_the_context(engines: tuple[Engine, Engine]) -> None:
    served, fresh = engines
    session = Session(served, GatewayConfig(), Dialect.GA, GatewayMetrics(), "long-call")
    session.open()
    drain(session)
    updated = await send(session, type="session.update", session={
        "output_modalities": ["text"], "max_output_tokens": REPLY_TOKENS, "temperature": 0,
        "audio": {"input": {"turn_detection": None}}})
    assert updated[-1]["type"] == "session.updated" and updated[-1]["session"]["truncation"] == "auto"
    shares, trimmed, gone, last_prompt = [], [], [], None
    for turn in range(TURNS):
        await send(session, type="input_audio_buffer.append", audio=spoken(turn))
        await send(session, type="input_audio_buffer.commit")
        if turn == TURNS - 1:
            last_prompt = session.conversation.prompt(session.settings.config)
        await deliver(session, json.dumps({"type": "response.create"}))
        assert session.response is not None and session.response.task is not None
        await asyncio.wait_for(session.response.task, 60)
        done = drain(session)[-1]
        assert done["type"] == "response.done" and done["response"]["status"] == "completed", done
        usage = done["response"]["usage"]
        shares.append(usage["input_token_details"]["cached_tokens"] / usage["input_tokens"])
        trimmed.append(not session.conversation.items[0].in_context)
        gone.append(sum(not item.in_context for item in session.conversation.items))
    start = trimmed.index(True)
    assert 20 < start < TURNS - 10, start  # trimming began, and a good part of the call came after
    after = shares[start:]
    assert sum(after) / len(after) >= 0.7, [round(s, 2) for s in after]
    # the turns that cut, and no others, prefill most of their prompt (when a session's first cut comes early, 60
    # turns may hold one more cut)
    cuts = {turn for turn in range(1, TURNS) if gone[turn] > gone[turn - 1]}
    assert {turn for turn in range(start, TURNS) if shares[turn] < 0.2} <= cuts <= set(range(start, TURNS)), (cuts, shares)
    assert len(cuts) <= 4, cuts
    await session.close()

    last_reply = done["response"]["output"][0]["content"][0]["text"]
    # the last turn reused its cache, unless it was one that cut (a session's own cut point may put one there)
    assert last_prompt is not None and (usage["input_token_details"]["cached_tokens"] > 0 or TURNS - 1 in cuts)
    request = EngineRequest("fresh", last_prompt, want_audio=False,
                            sampling=SamplingParams(max_tokens=REPLY_TOKENS, temperature=0))
    events = [event async for event in await fresh.submit(request)]
    assert isinstance(events[-1], Finished) and events[-1].timings.cached_tokens == 0
    assert events[-1].timings.prompt_tokens == usage["input_tokens"]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == last_reply
