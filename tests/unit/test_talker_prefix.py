"""The Talker's kept prefixes (engine/runners/talker_prefix.py): a conversation's next turn takes the slot its
last reply left and prefills only its new user rows, and the reply it speaks is the one a fresh engine speaks
from the whole prompt."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry, Counter

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
from engine.runners.kv_cache import SlotKVCache
from engine.runners.talker_prefix import KeptRows, TalkerPrefixCache, user_row_ends


def small_cache(slots: int, min_rows: int = 4) -> TalkerPrefixCache:
    kv = SlotKVCache(num_layers=1, num_slots=slots, num_kv_heads=1, head_dim=2, max_len=64, dtype=torch.float32,
                     device="cpu")
    rows = Counter("rows", "", ["source"], registry=CollectorRegistry())
    return TalkerPrefixCache(kv, rows, min_rows=min_rows)


def test_user_rows_end_where_their_thinker_positions_do() -> None:
    assert user_row_ends(((2, 5), (9, 11))).tolist() == [3, 4, 5, 10, 11]
    assert user_row_ends(()).tolist() == []


def test_a_next_turn_takes_the_rows_before_the_prompts_part() -> None:
    cache = small_cache(3)
    # system 0-3, user 4-11, assistant 12-15: the user rows end at 5..12
    turn = np.arange(100, 116)
    kept_ends = user_row_ends(((4, 12),))
    slot = cache.kv.allocate()
    cache.keep(KeptRows(slot, turn, kept_ends))
    # the next turn continues it, then a new user turn at 16-23
    following = np.concatenate([turn, np.arange(200, 208)])
    ends = user_row_ends(((4, 12), (16, 24)))
    reuse = cache.claim(following, ends)
    assert reuse is not None and (reuse.slot, reuse.rows) == (slot, 8) and not cache.entries
    cache.keep(KeptRows(reuse.slot, turn, kept_ends))

    # a prompt that parts at position 8, inside the user turn: its first 4 user rows hold
    parted = turn.copy()
    parted[8] = 999
    reuse = cache.claim(parted, kept_ends)
    assert reuse is not None and reuse.rows == 4
    cache.keep(KeptRows(reuse.slot, turn, kept_ends))

    # another system prompt changes every hidden row after it: nothing holds
    other = turn.copy()
    other[1] = 999
    assert cache.claim(other, kept_ends) is None
    # the same prompt again: every user row but the last, which is always prefilled
    reuse = cache.claim(turn, kept_ends)
    assert reuse is not None and reuse.rows == 7


def test_short_rows_are_not_kept_and_kept_slots_are_given_back_oldest_first() -> None:
    cache = small_cache(2)
    short = cache.kv.allocate()
    cache.keep(KeptRows(short, np.arange(5), user_row_ends(((0, 3),))))  # 3 rows < min_rows
    assert not cache.entries and cache.kv.num_free == 2
    first, second = cache.kv.allocate(), cache.kv.allocate()
    cache.keep(KeptRows(first, np.arange(10), user_row_ends(((0, 10),))))
    cache.keep(KeptRows(second, np.arange(10, 20), user_row_ends(((0, 10),))))
    assert cache.num_free == 2 and cache.kv.num_free == 0
    assert cache.allocate() == first and list(cache.entries) == [second]


# -- end to end on the tiny engine


@pytest.fixture(scope="module")
async def engines(tiny_checkpoint: Path, cache_dir: Path) -> AsyncIterator[tuple[Engine, Engine]]:
    profile = load_profile(model="tiny", platform="cpu", stage_overrides={"thinker": {"ignore_eos": True}})
    served, fresh = create_engine("tiny", profile, cache_dir), create_engine("tiny", profile, cache_dir)
    await served.start()
    await fresh.start()
    yield served, fresh
    await served.stop()
    await fresh.stop()


def tone(seconds: float, hz: float) -> np.ndarray:
    return (0.2 * np.sin(2 * np.pi * hz * np.arange(int(16_000 * seconds)) / 16_000)).astype(np.float32)


async def reply(engine: Engine, request_id: str, messages: tuple[Message, ...]) -> tuple[str, np.ndarray]:
    request = EngineRequest(request_id, messages, want_audio=True, speaker="ethan",
                            sampling=SamplingParams(max_tokens=6, temperature=0, seed=7))
    events = [event async for event in await engine.submit(request)]
    assert isinstance(events[-1], Finished), events[-1]
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    return text, np.concatenate([e.samples for e in events if isinstance(e, AudioChunk)])


def cached_rows(engine: Engine) -> float:
    return engine.registry.get_sample_value("engine_talker_prompt_rows_total", {"source": "cached"}) or 0.0


@pytest.mark.asyncio(loop_scope="session")
async def test_a_spoken_next_turn_reuses_the_talker_rows_and_says_the_same(engines: tuple[Engine, Engine]) -> None:
    served, fresh = engines
    first = (Message("system", (TextPart("You are a voice assistant."),)),
             Message("user", (AudioPart(tone(3.0, 330.0)),)))
    said, _ = await reply(served, "turn-1", first)
    assert cached_rows(served) == 0
    second = (*first, Message("assistant", (TextPart(said),)), Message("user", (AudioPart(tone(2.0, 440.0)),)))
    _, audio = await reply(served, "turn-2", second)
    assert cached_rows(served) >= 32  # the first user turn's rows: its clip's ~40 and the turn's own
    _, whole = await reply(fresh, "whole", second)
    assert cached_rows(fresh) == 0
    np.testing.assert_allclose(audio, whole, atol=1e-4)
