"""The Thinker paced to the Talker (`first_packet.text_lead`, engine/omni/stages/policy.py): same replies,
fewer runaway steps, and no text made beside a first chunk's frames.

The tiny engine on the CPU, one reply at a time with a fixed seed, paced and not: pacing only
moves when the Thinker's steps happen, never what they compute.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from engine import AudioChunk, EngineRequest, Message, SamplingParams, TextDelta, TextPart, create_engine
from engine.omni.stages.policy import FirstPacketPolicy
from engine.profile import ChunkConfig, FirstPacketConfig, load_profile

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
    leads: list[list[int]]  # per Thinker step for the running replies alone, each speaking reply's tokens ahead of its speech
    seen: list[list[tuple[int, int]]]  # per such step, each speaking reply's (text tokens, rows spoken)
    paused: int  # loop turns with replies running and no Thinker work


def _run(cache_dir, lead: int, talker: dict | None = None, audio: bool = True, max_tokens: int = 12,
         chunks: bool = True):
    """One reply, and what the Thinker saw at each step it took for the running replies alone."""
    profile = load_profile(model="tiny", platform="cpu", stage_overrides={"talker": talker or {}},
                           overrides={"first_packet": {"text_lead": lead}, "async_chunk": {"enabled": chunks}})
    engine = create_engine("tiny", profile, cache_dir)
    thinker = engine.core.core.stages["thinker"]
    leads: list[list[int]] = []
    seen: list[list[tuple[int, int]]] = []
    paused = 0
    step, has_work = thinker.step, thinker.has_work

    def watched_step():
        if thinker.running and not thinker.partial and not thinker.waiting:
            leads.append([len(s.generated) - s.spoken for s in thinker.running.values() if not s.talker_done])
            seen.append([(len(s.generated), s.spoken) for s in thinker.running.values() if not s.talker_done])
        return step()

    def watched_has_work():
        nonlocal paused
        work = has_work()
        paused += bool(thinker.running) and not work
        return work

    thinker.step, thinker.has_work = watched_step, watched_has_work

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
    # a decode runs only while some reply is fewer than LEAD tokens ahead of its speech, or its first chunk still
    # needs text (how far ahead the Thinker gets then depends on how long the Talker's first step takes)
    first = FirstPacketPolicy(FirstPacketConfig(text_lead=LEAD), load_profile(model="tiny", platform="cpu").async_chunk)
    assert paced.seen and all(any(made - spoken < LEAD or made < first.first_chunk_rows
                                  for made, spoken in step) for step in paced.seen if step), paced.seen


def test_text_only_replies_are_never_paced(cache_dir) -> None:
    run = _run(cache_dir, lead=LEAD, audio=False)
    assert run.text and len(run.samples) == 0 and run.paused == 0


def test_text_goes_on_when_speech_stops_first(cache_dir) -> None:
    """Speech capped at three frames: the Talker is done with the reply, the Thinker is not."""
    paced = _run(cache_dir, lead=LEAD, talker={"max_frames": 3}, max_tokens=20)
    unpaced = _run(cache_dir, lead=0, talker={"max_frames": 3}, max_tokens=20)
    assert paced.text == unpaced.text and len(paced.text) > 0
    assert len(paced.samples) > 0


@dataclass(frozen=True)
class Text:
    made: int
    spoken: int
    paced: bool = True


def test_first_chunk_priority_in_the_policy() -> None:
    """A first chunk of 2 frames consumes 3 rows. While one reply's first chunk is being made and holds
    all its text, another reply 2 tokens ahead waits, where a lead of 8 alone would let it step."""
    with_chunks = FirstPacketPolicy(FirstPacketConfig(text_lead=8), ChunkConfig(initial_chunk_frames=2))
    without = FirstPacketPolicy(FirstPacketConfig(text_lead=8), ChunkConfig(enabled=False))
    making_first_chunk = [Text(made=3, spoken=1), Text(made=6, spoken=4)]
    assert without.thinker_may_decode(making_first_chunk)
    assert not with_chunks.thinker_may_decode(making_first_chunk)
    # a first chunk that still needs text is made first
    assert with_chunks.thinker_may_decode([Text(made=2, spoken=0), Text(made=9, spoken=1)])
    # text nobody speaks is never held back; nothing running, nothing to do
    assert with_chunks.thinker_may_decode([Text(made=3, spoken=1), Text(made=50, spoken=0, paced=False)])
    assert not with_chunks.thinker_may_decode([])


def test_no_decode_runs_beside_a_first_chunk_that_has_its_text(cache_dir) -> None:
    """A wide lead (8) that alone would keep the Thinker stepping beside the Talker's first frames."""
    rows = load_profile(model="tiny", platform="cpu").async_chunk.initial_chunk_frames + 1

    def beside_first_chunk(seen: list[tuple[int, int]]) -> bool:
        return any(0 < spoken < rows <= made for made, spoken in seen)

    unpaced = _run(cache_dir, lead=0, max_tokens=16)
    first = _run(cache_dir, lead=8, max_tokens=16)
    # without chunks there is no early first packet to make room for: the same lead steps beside those rows
    no_first_chunk = _run(cache_dir, lead=8, max_tokens=16, chunks=False)
    assert first.text == unpaced.text == no_first_chunk.text and len(unpaced.text) > 0
    np.testing.assert_array_equal(first.samples, unpaced.samples)
    assert any(beside_first_chunk(seen) for seen in no_first_chunk.seen), "the rule would have nothing to do"
    assert first.seen and not any(beside_first_chunk(seen) for seen in first.seen), first.seen
