"""The Talker's kept prefixes (engine/omni/runners/talker_prefix.py): a conversation's next turn takes the slot its
last reply left and prefills only its new user rows, and the reply it speaks is the one a fresh engine speaks
from the whole prompt."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry, Counter, Gauge

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
from engine.omni.runners.kv_cache import SlotKVCache
from engine.omni.runners.talker_prefix import KeptRows, TalkerPrefixCache, user_row_ends


def small_cache(slots: int, min_rows: int = 4, pages: int | None = None) -> TalkerPrefixCache:
    """Slots of 64 rows, in pages of 8 (`pages` of them: every slot its 64 rows by default)."""
    kv = SlotKVCache(num_layers=1, num_slots=slots, num_kv_heads=1, head_dim=2, max_len=64, dtype=torch.float32,
                     device="cpu", num_pages=pages, page_size=8)
    registry = CollectorRegistry()
    rows = Counter("rows", "", ["source"], registry=registry)
    return TalkerPrefixCache(kv, rows, Gauge("pages", "", ["holder"], registry=registry), min_rows=min_rows)


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


def test_a_kept_slot_holds_its_user_rows_pages_alone() -> None:
    cache = small_cache(2, pages=10)
    slot = cache.kv.allocate()
    assert cache.reserve(slot, 60)  # 8 pages: a prompt of 20 user rows, the assistant part and frames
    cache.keep(KeptRows(slot, np.arange(30), user_row_ends(((0, 20),))))
    assert cache.kv.pages(slot) and cache.kv.held[slot] == 3 and cache.kv.num_free_pages == 7
    cache.count_pages()
    assert {h: cache.pages.labels(h)._value.get() for h in ("replies", "kept", "free")} == \
        {"replies": 0, "kept": 3, "free": 7}


def test_a_reply_takes_kept_pages_oldest_first_and_none_when_even_they_would_not_do() -> None:
    cache = small_cache(4, pages=12)
    speaking = cache.kv.allocate()
    assert cache.reserve(speaking, 40)  # 5 pages
    old, new = cache.kv.allocate(), cache.kv.allocate()
    for slot, rows in ((old, 32), (new, 16)):  # 4 and 2 pages
        assert cache.reserve(slot, rows)
        cache.keep(KeptRows(slot, np.arange(100 * slot, 100 * slot + rows), user_row_ends(((0, rows),))))
    reply = cache.allocate()
    assert cache.kv.num_free_pages == 1 and cache.can_hold(56) and not cache.can_hold(64)
    assert not cache.reserve(reply, 64)  # 8 pages: 1 free and 6 kept would not do
    assert list(cache.entries) == [old, new]  # nothing given up for a reservation that failed
    assert cache.reserve(reply, 40)  # 5 pages: the free one, then the oldest kept slot's 4
    assert list(cache.entries) == [new] and cache.kv.num_free_pages == 0 and cache.kv.held[reply] == 5
    cache.count_pages()
    assert {h: cache.pages.labels(h)._value.get() for h in ("replies", "kept", "free")} == \
        {"replies": 10, "kept": 2, "free": 0}


# -- end to end on the tiny engine


@pytest.fixture(scope="module")
async def engines(tiny_checkpoint: Path, cache_dir: Path) -> AsyncIterator[tuple[Engine, Engine]]:
    profile = load_profile(model="tiny", platform="cpu", stage_overrides={"thinker": {"ignore_eos": True}})
    # the served engine's Talker on the smallest pool its profile allows: kept rows and replies share 5 pages
    pooled = load_profile(model="tiny", platform="cpu", stage_overrides={
        "thinker": {"ignore_eos": True}, "talker": {"kv_cache_tokens": profile.stages.talker_max_len}})
    served, fresh = create_engine("tiny", pooled, cache_dir), create_engine("tiny", profile, cache_dir)
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
