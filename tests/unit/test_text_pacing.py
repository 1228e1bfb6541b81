"""The Thinker pacing itself to the Talker (`pace_text_lead`): same replies, fewer runaway steps.

The tiny engine on the CPU, one reply at a time with a fixed seed, paced and not: pacing only
moves when the Thinker's steps happen, never what they compute.
"""

from __future__ import annotations

import asyncio

import numpy as np

from engine.api import AudioChunk, EngineRequest, Message, SamplingParams, TextDelta, TextPart, create_engine
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


def _run(cache_dir, lead: int, talker: dict | None = None, audio: bool = True, max_tokens: int = 12):
    """The reply, and per Thinker decode the leads it saw (tokens ahead of the Talker per reply)."""
    overrides = {"thinker": {"pace_text_lead": lead}, "talker": talker or {}}
    engine = create_engine("tiny", load_profile(model="tiny", platform="cpu", stage_overrides=overrides), cache_dir)
    thinker = engine.stages["thinker"]
    leads: list[list[int]] = []
    paused = 0
    decode, has_work = thinker._decode, thinker.has_work

    def watched_decode():
        leads.append([len(s.generated) - s.spoken for s in thinker.running.values() if not s.talker_done])
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
    return text, samples, leads, paused


def test_a_paced_reply_equals_the_unpaced_one_and_its_text_waits_for_speech(cache_dir) -> None:
    text, samples, _, paused_unpaced = _run(cache_dir, lead=0)
    paced_text, paced_samples, leads, paused = _run(cache_dir, lead=LEAD)
    assert paced_text == text and len(text) > 0
    np.testing.assert_array_equal(paced_samples, samples)
    assert paused_unpaced == 0
    assert paused > 0  # the tiny Talker is slower than its Thinker: pacing had something to do
    # a decode runs only while some reply is fewer than LEAD tokens ahead of its speech
    assert leads and all(min(seen) < LEAD for seen in leads if seen)


def test_text_only_replies_are_never_paced(cache_dir) -> None:
    text, samples, leads, paused = _run(cache_dir, lead=LEAD, audio=False)
    assert text and len(samples) == 0 and paused == 0


def test_text_goes_on_when_speech_stops_first(cache_dir) -> None:
    """Speech capped at three frames: the Talker is done with the reply, the Thinker is not."""
    text, samples, _, _ = _run(cache_dir, lead=LEAD, talker={"max_frames": 3}, max_tokens=20)
    unpaced, _, _, _ = _run(cache_dir, lead=0, talker={"max_frames": 3}, max_tokens=20)
    assert text == unpaced and len(text) > 0
    assert len(samples) > 0
