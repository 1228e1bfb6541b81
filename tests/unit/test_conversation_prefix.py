"""A conversation on the tiny engine: turn 2 prefills only what turn 1 did not leave in the cache, and
replies exactly as a full prefill would; more conversations than request slots keep their prefixes, and kept
prefixes give way to new requests; a long prompt prefilled in pieces replies as one prefilled whole; a steady
run does no cold work."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from engine import (
    AudioChunk,
    AudioPart,
    Engine,
    EngineRequest,
    Finished,
    Message,
    SamplingParams,
    TextDelta,
    TextPart,
    create_engine,
    load_profile,
)
from engine.metrics import EAGER_FALLBACK, TORCH_COMPILE, TRITON_COMPILE, UNWARMED_SHAPE
from engine.omni.runners.prefix_cache import KEPT_PER_SLOT


def _engine(cache_dir: Path, **thinker: object) -> Engine:
    profile = load_profile(model="tiny", platform="cpu", stage_overrides={
        "thinker": {"ignore_eos": True, **thinker}, "talker": {"max_frames": 12}})
    return create_engine("tiny", profile, cache_dir)


def _tone(seconds: float, step: float) -> np.ndarray:
    return (0.2 * np.sin(np.arange(int(16_000 * seconds)) * step)).astype(np.float32)


# long enough that turn 2's common prefix passes the cache's minimum (64 tokens)
FIRST = Message("user", (AudioPart(_tone(4.5, 0.05)), TextPart("what is this sound")))
SECOND = Message("user", (AudioPart(_tone(0.9, 0.08)), TextPart("and now?")))


class Reply:
    def __init__(self, events: list) -> None:
        self.tokens = [t for e in events if isinstance(e, TextDelta) for t in e.token_ids]
        self.text = "".join(e.text for e in events if isinstance(e, TextDelta))
        chunks = [e.samples for e in events if isinstance(e, AudioChunk)]
        self.audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
        self.finished = events[-1]
        assert isinstance(self.finished, Finished), events[-1]


async def _ask(engine: Engine, rid: str, *messages: Message, audio: bool = True, max_tokens: int = 6) -> Reply:
    request = EngineRequest(rid, messages, want_audio=audio, sampling=SamplingParams(max_tokens=max_tokens, seed=3))
    return Reply([event async for event in await engine.submit(request)])


def _metrics(engine: Engine):  # the orchestrator's (behind the admission gate)
    return engine.core.core.metrics  # type: ignore[attr-defined]


async def test_turn_two_prefills_only_what_is_new_and_replies_as_a_full_prefill(cache_dir: Path) -> None:
    reused, whole = _engine(cache_dir), _engine(cache_dir)
    await reused.start()
    await whole.start()
    try:
        first = await _ask(reused, "t1", FIRST)
        assert first.finished.timings.cached_tokens == 0
        history = (FIRST, Message("assistant", (TextPart(first.text),)), SECOND)
        second = await _ask(reused, "t2", *history)
        expected = await _ask(whole, "t2", *history)
        timings = second.finished.timings
        # at least the whole first prompt came from the cache; what was prefilled is the rest
        assert timings.cached_tokens >= first.finished.timings.prompt_tokens
        assert expected.finished.timings.cached_tokens == 0
        assert second.tokens == expected.tokens
        assert second.audio.shape == expected.audio.shape and np.allclose(second.audio, expected.audio, atol=1e-3)
        cached = _metrics(reused).prompt_tokens.labels("cached")._value.get()
        assert cached == timings.cached_tokens
    finally:
        await reused.stop()
        await whole.stop()


@pytest.mark.parametrize("host_gib", [0.0, 1.0])
async def test_kept_prefixes_give_way_to_new_requests(cache_dir: Path, host_gib: float) -> None:
    """Requests of their own take every slot (two for requests, and those for kept prefixes), so the
    conversation's kept prefix gives its slot back: to the host pool, whence its next turn copies it back and
    replies as a full prefill would; with no pool, gone."""
    engine, whole = _engine(cache_dir, max_batch=2, kept_prefix_host_gib=host_gib), _engine(cache_dir)
    await engine.start()
    await whole.start()
    try:
        first = await _ask(engine, "a1", FIRST)
        for i in range(2 * (1 + KEPT_PER_SLOT)):
            await _ask(engine, f"other{i}", Message("user", (TextPart(f"an unrelated question number {i}"),)))
        history = (FIRST, Message("assistant", (TextPart(first.text),)), SECOND)
        again = await _ask(engine, "a2", *history)
        evictions = _metrics(engine).prefix.evictions
        if host_gib:
            assert again.finished.timings.cached_tokens >= first.finished.timings.prompt_tokens
            assert _metrics(engine).prefix.lookups.labels("host")._value.get() == 1
            assert evictions.labels("to_host")._value.get() >= 1 and evictions.labels("dropped")._value.get() == 0
            expected = await _ask(whole, "a2", *history)
            assert again.tokens == expected.tokens
            assert np.allclose(again.audio, expected.audio, atol=1e-3)
        else:
            assert again.finished.timings.cached_tokens == 0  # evicted: a full prefill, and still a reply
            assert evictions.labels("dropped")._value.get() >= 1
        assert again.finished.timings.completion_tokens == 6
    finally:
        await engine.stop()
        await whole.stop()


async def test_more_conversations_than_request_slots_keep_their_prefixes(cache_dir: Path) -> None:
    """Five conversations on two request slots and no host pool: each one's turn 1 stays in a kept slot while
    the others speak, and its turn 2 prefills only what is new, in the Thinker and in the Talker."""
    engine = _engine(cache_dir, max_batch=2, kept_prefix_host_gib=0.0)
    await engine.start()
    try:
        firsts = [Message("user", (AudioPart(_tone(4.5, 0.05 + 0.01 * i)), TextPart("what is this sound")))
                  for i in range(5)]
        replies = [await _ask(engine, f"c{i}-1", first) for i, first in enumerate(firsts)]
        for i, (first, reply) in enumerate(zip(firsts, replies, strict=True)):
            again = await _ask(engine, f"c{i}-2", first, Message("assistant", (TextPart(reply.text),)), SECOND)
            assert again.finished.timings.cached_tokens >= reply.finished.timings.prompt_tokens, i
        metrics = _metrics(engine)
        assert metrics.prefix.evictions.labels("dropped")._value.get() == 0
        assert metrics.talker_prompt_rows.labels("cached")._value.get() >= 5 * 32
    finally:
        await engine.stop()


async def test_a_long_prompt_in_pieces_replies_as_one_prefill(cache_dir: Path) -> None:
    pieces, whole = _engine(cache_dir, max_step_tokens=80), _engine(cache_dir)
    await pieces.start()
    await whole.start()
    try:
        long = (Message("user", (AudioPart(_tone(1.5, 0.04)), TextPart("tell me a story " * 40))),)
        # a reply running beside it keeps decoding between the pieces
        short = Message("user", (TextPart("hi"),))
        expected = await _ask(whole, "long", *long, max_tokens=8)
        running = await _ask(pieces, "short", short, audio=False, max_tokens=2)
        got = await _ask(pieces, "long", *long, max_tokens=8)
        assert running.finished.timings.completion_tokens == 2
        assert got.finished.timings.prompt_tokens > 160  # several pieces of at most 80
        assert got.tokens == expected.tokens and np.allclose(got.audio, expected.audio, atol=1e-3)
    finally:
        await pieces.stop()
        await whole.stop()


async def test_a_prompt_whose_last_piece_ends_at_the_context_end_replies(cache_dir: Path) -> None:
    """Prompts whose last piece starts within one piece of `max_model_len`, beside a running reply: no piece
    writes past its slot (right-padded groups once did, and failed the step), and each reply ends at the
    context's end."""
    engine = _engine(cache_dir, max_model_len=256, max_step_tokens=80)
    await engine.start()
    try:
        running = asyncio.ensure_future(_ask(engine, "short", Message("user", (TextPart("hi"),)), audio=False,
                                             max_tokens=40))
        replies = await asyncio.gather(*(
            _ask(engine, f"long{n}", Message("user", (TextPart("word " * n),)), audio=False, max_tokens=4)
            for n in (230, 236, 243)))
        assert (await running).finished.timings.completion_tokens == 40
        for reply in replies:
            timings = reply.finished.timings
            assert reply.finished.finish_reason == "length" and timings.completion_tokens == 4
        assert max(r.finished.timings.prompt_tokens for r in replies) == 252
    finally:
        await engine.stop()


async def test_a_steady_run_does_no_cold_work_and_a_compile_after_ready_is_counted(cache_dir: Path) -> None:
    engine = _engine(cache_dir)
    await engine.start()
    try:
        cold = _metrics(engine).cold_work
        await _ask(engine, "text", Message("user", (TextPart("hello there"),)), audio=False)
        await _ask(engine, "spoken", FIRST)
        for kind in (TORCH_COMPILE, TRITON_COMPILE, EAGER_FALLBACK, UNWARMED_SHAPE):
            assert cold.count(kind) == 0, kind
        # a spoken reply's gaps between its text tokens and between its frames are counted, per stage
        registry = _metrics(engine).registry
        for stage in ("thinker", "talker"):
            assert registry.get_sample_value("engine_reply_gap_seconds_count", {"stage": stage}) > 0, stage
        # the hook is live: a compile now is cold work (the eager backend: no C++ toolchain needed)
        torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(3))
        assert cold.count(TORCH_COMPILE) >= 1
    finally:
        await engine.stop()
