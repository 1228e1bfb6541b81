"""The Thinker pacing itself to the Talker (`pace_text_lead`): same replies, fewer runaway steps.

The tiny engine on the CPU, one reply at a time with a fixed seed, paced and not: pacing only
moves when the Thinker's steps happen, never what they compute.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from engine import AudioChunk, EngineRequest, Message, SamplingParams, TextDelta, TextPart, create_engine
from engine.profile import load_profile

LEAD = 2


async def _reply(engine, rid: str, audio: bool, max_tokens: int) -> tuple[str, np.ndarray]:
    request = EngineRequest(rid, (Message("user", (TextPart("tell me a story"),)),), audio, "ethan",
                            SamplingParams(max_tokens=max_tokens, seed=7))
    text, samples = [], []
    async for event in await engine.submit(request):
        if isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, AudioChunk):
            samples.append(event.samples)
    return "".join(text), np.concatenate(samples) if samples else np.zeros(0, np.float32)


@dataclass
class Run:
    text: str
    samples: np.ndarray
    leads: list[list[int]]  # per Thinker decode, each speaking reply's tokens ahead of its speech
    seen: list[list[tuple[int, int]]]  # per Thinker decode, each speaking reply's (text tokens, rows spoken)
    paused: int  # loop turns with replies running and no Thinker work


def _run(cache_dir, lead: int, talker: dict | None = None, audio: bool = True, max_tokens: int = 12,
         first_chunk_priority: bool = False):
    """One reply, and what the Thinker saw at each of its decodes."""
    overrides = {"thinker": {"pace_text_lead": lead, "first_chunk_priority": first_chunk_priority},
                 "talker": talker or {}}
    engine = create_engine("tiny", load_profile(model="tiny", platform="cpu", stage_overrides=overrides), cache_dir)
    thinker = engine.stages["thinker"]
    leads: list[list[int]] = []
    seen: list[list[tuple[int, int]]] = []
    paused = 0
    decode, has_work = thinker._decode, thinker.has_work

    def watched_decode():
        leads.append([len(s.generated) - s.spoken for s in thinker.running.values() if not s.talker_done])
        seen.append([(len(s.generated), s.spoken) for s in thinker.running.values() if not s.talker_done])
        return decode()

    def watched_has_work():
        nonlocal paused
        work = has_work()
        paused += bool(thinker.running) and not work
        return work

    thinker._decode, thinker.has_work = watched_decode, watched_has_work

    async def go():
        await engine.start()
        try:
            return await asyncio.wait_for(_reply(engine, "r", audio, max_tokens), timeout=120)
        finally:
            await engine.stop()

    text, samples = asyncio.run(go())
    return Run(text, samples, leads, seen, paused)


def test_a_paced_reply_equals_the_unpaced_one_and_its_text_waits_for_speech(cache_dir) -> None:
    unpaced, paced = _run(cache_dir, lead=0), _run(cache_dir, lead=LEAD)
    assert paced.text == unpaced.text and len(unpaced.text) > 0
    np.testing.assert_array_equal(paced.samples, unpaced.samples)
    assert unpaced.paused == 0
    assert paced.paused > 0  # the tiny Talker is slower than its Thinker: pacing had something to do
    # a decode runs only while some reply is fewer than LEAD tokens ahead of its speech
    assert paced.leads and all(min(seen) < LEAD for seen in paced.leads if seen)


def test_text_only_replies_are_never_paced(cache_dir) -> None:
    run = _run(cache_dir, lead=LEAD, audio=False)
    assert run.text and len(run.samples) == 0 and run.paused == 0


def test_text_goes_on_when_speech_stops_first(cache_dir) -> None:
    """Speech capped at three frames: the Talker is done with the reply, the Thinker is not."""
    paced = _run(cache_dir, lead=LEAD, talker={"max_frames": 3}, max_tokens=20)
    unpaced = _run(cache_dir, lead=0, talker={"max_frames": 3}, max_tokens=20)
    assert paced.text == unpaced.text and len(paced.text) > 0
    assert len(paced.samples) > 0


def test_first_chunk_priority_holds_text_back_while_a_first_chunk_is_made(cache_dir) -> None:
    """A wide lead (8) that would keep the Thinker stepping beside the Talker's first frames: with the
    priority, no decode runs while the reply's first chunk is being made and has all its text."""
    rows = load_profile(model="tiny", platform="cpu").async_chunk.initial_chunk_frames + 1

    def beside_first_chunk(seen: list[tuple[int, int]]) -> bool:
        return any(0 < spoken < rows <= made for made, spoken in seen)

    unpaced = _run(cache_dir, lead=0, max_tokens=16)
    paced = _run(cache_dir, lead=8, max_tokens=16)
    first = _run(cache_dir, lead=8, max_tokens=16, first_chunk_priority=True)
    assert first.text == paced.text == unpaced.text and len(unpaced.text) > 0
    np.testing.assert_array_equal(first.samples, unpaced.samples)
    np.testing.assert_array_equal(paced.samples, unpaced.samples)
    assert any(beside_first_chunk(seen) for seen in paced.seen), "the rule below would have nothing to do"
    assert first.seen and not any(beside_first_chunk(seen) for seen in first.seen), first.seen
