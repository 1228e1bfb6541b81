"""Prefix reuse and pieces: what a prompt's rows after a cached prefix compute equals a whole prefill, kept rows
are taken as pieces without copies, and the audio tower batched and padded equals transformers' clip by clip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry
from transformers import AutoTokenizer, WhisperFeatureExtractor

from engine import AudioPart, Message, TextPart
from engine.intake.prompt import PromptBuilder
from engine.metrics import PrefixCacheMetrics
from engine.omni.runners.kv_cache import SlotKVCache
from engine.omni.runners.prefix_cache import Entry, PrefixCache, head, host_rows, position_keys
from engine.omni.runners.thinker import StepRow, ThinkerRunner
from engine.omni.weights.checkpoint import load_stage
from engine.positions import placeholder_spans


@pytest.fixture(scope="module")
def thinker(tiny_checkpoint: Path) -> tuple[ThinkerRunner, PromptBuilder]:
    loaded = load_stage(tiny_checkpoint, "thinker", device="cpu", dtype="float32")
    builder = PromptBuilder(AutoTokenizer.from_pretrained(tiny_checkpoint),
                            WhisperFeatureExtractor.from_pretrained(tiny_checkpoint), n_window=50)
    with torch.inference_mode():
        return ThinkerRunner(loaded.model, loaded.config, max_batch=6, max_len=256), builder


def tone(seconds: float, step: float) -> np.ndarray:
    return (0.2 * np.sin(np.arange(int(16_000 * seconds)) * step)).astype(np.float32)


def test_rows_after_a_prefix_equal_a_whole_prefill(thinker: tuple[ThinkerRunner, PromptBuilder]) -> None:
    runner, builder = thinker
    prompt = builder.build((
        Message("user", (AudioPart(tone(1.5, 0.05)), TextPart("what was that sound"))),
        Message("assistant", (TextPart("a tone, rising and falling"),)),
        Message("user", (AudioPart(tone(2.2, 0.09)), TextPart("and this one?"))),
    ))
    ids, clips = prompt.token_ids, placeholder_spans(prompt.token_ids, runner.audio_token_id)
    assert len(clips) == 2
    cut = clips[1][0] - 3  # the second clip and what follows are new
    with torch.inference_mode():
        whole = runner.step([StepRow(0, ids, audio=tuple(prompt.audio_features))])[0]
        first = runner.step([StepRow(1, ids[:cut], audio=(prompt.audio_features[0],))])[0]
        # the rest in two pieces, batched with an unrelated whole prompt
        other = builder.build((Message("user", (TextPart("something else entirely"),)),)).token_ids
        middle = clips[1][1] + 2
        rest = runner.step([StepRow(2, other), StepRow(1, ids[cut:middle], cut, (prompt.audio_features[1],))])[1]
        last = runner.step([StepRow(1, ids[middle:], middle)])[0]
        assert torch.allclose(torch.cat([first.hidden, rest.hidden, last.hidden]), whole.hidden, atol=1e-4)
        assert torch.allclose(torch.cat([first.embeds, rest.embeds, last.embeds]), whole.embeds, atol=1e-5)
        assert torch.allclose(last.logits, whole.logits, atol=1e-4)
        n = len(ids)
        assert torch.allclose(runner.step([StepRow(0, [7], n)])[0].logits, runner.step([StepRow(1, [7], n)])[0].logits,
                              atol=1e-4)


def test_audio_tower_batched_and_padded_equals_transformers_clip_by_clip(
        thinker: tuple[ThinkerRunner, PromptBuilder]) -> None:
    """The padded layout (engine/omni/runners/audio_tower.py) against transformers' own forward: clips of under a
    second, with a tail chunk, and of two attention windows (8 s each), alone, together and padded to a bucket."""
    runner, builder = thinker
    clips = [builder.build((Message("user", (AudioPart(tone(s, step)),)),)).audio_features[0]
             for s, step in ((0.7, 0.03), (2.4, 0.06), (1.0, 0.11), (9.3, 0.02))]
    with torch.inference_mode():
        reference = [runner.audio._encode([clip]) for clip in clips]
        alone = [runner.audio([clip], r.shape[0]) for clip, r in zip(clips, reference, strict=True)]
        together = runner.audio(clips, sum(r.shape[0] for r in reference))
        runner.audio.buckets = (16, 32)  # 1 + 3 + 1 + 10 chunks, padded to 16
        padded = runner.audio(clips, together.shape[0])
        runner.audio.buckets = ()
    for mine, theirs in zip(alone, reference, strict=True):
        assert torch.allclose(mine, theirs, atol=1e-4)
    assert torch.allclose(together, torch.cat(reference), atol=1e-4)
    assert torch.allclose(padded, together, atol=1e-4)


def small_cache(slots: int, host_bytes: int = 0, pages: int | None = None) -> PrefixCache:
    """Slots of 64 positions, pages of 16: four pages a slot, and by default the pool holds them all."""
    kv = SlotKVCache(num_layers=2, num_slots=slots, num_kv_heads=1, head_dim=4, max_len=64, dtype=torch.float32,
                     device="cpu", num_pages=pages, page_size=16)
    return PrefixCache(kv, PrefixCacheMetrics(CollectorRegistry()), min_tokens=4, host_bytes=host_bytes)


def counted(cache: PrefixCache) -> dict[str, float]:
    m = cache.metrics
    return {**{k: m.lookups.labels(k)._value.get() for k in ("slot", "host", "miss")},
            **{k: m.evictions.labels(k)._value.get() for k in ("to_host", "dropped")},
            "bytes": m.host_bytes._value.get()}


def keep(cache: PrefixCache, tokens: list[int], prompt_len: int | None = None) -> int:
    slot = cache.allocate()
    assert cache.reserve(slot, len(tokens) + 16)  # its reply's room too, which keep() gives back
    rows = torch.tensor(tokens, dtype=torch.float32)[None, :, None].expand(1, -1, 4)
    for layer in range(len(cache.kv.keys)):
        cache.kv.write(slot, layer, rows, -rows)
    cache.keep(Entry(slot, np.asarray(tokens), len(tokens) if prompt_len is None else prompt_len, None, None))
    return slot


def test_a_continuing_prompt_takes_the_slot_and_a_shared_prefix_is_copied() -> None:
    cache = small_cache(4)
    conversation = list(range(10, 30))
    slot = keep(cache, conversation)
    reuse = cache.claim(np.asarray(conversation + [99, 98]), [], want_hidden=False)
    assert reuse is not None and (reuse.slot, reuse.length) == (slot, 20) and len(cache) == 0

    system = list(range(100, 110))
    shared = keep(cache, system + [1, 2, 3])
    reuse = cache.claim(np.asarray(system + [7, 7, 7, 7]), [], want_hidden=False)
    assert reuse is not None and reuse.slot != shared and reuse.length == 10 and len(cache) == 1
    assert all(torch.equal(x, y) for x, y in zip(cache.kv.read(reuse.slot, 10, 1), cache.kv.read(shared, 10, 1),
                                                 strict=True))
    assert cache.claim(np.asarray([5, 6, 7, 8, 9]), [], want_hidden=False) is None  # nothing in common

    # a next turn that parts from the kept one inside its reply (the reply's text tokenizes otherwise)
    turn = list(range(40, 60))
    kept = keep(cache, turn + [1, 2, 3, 4], prompt_len=20)
    reuse = cache.claim(np.asarray(turn + [1, 2, 9, 9, 9]), [], want_hidden=False)
    assert reuse is not None and (reuse.slot, reuse.length) == (kept, 22)  # moved, not copied


def test_a_match_never_ends_inside_a_clip_nor_covers_the_last_position() -> None:
    cache = small_cache(2)
    first = position_keys([1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 9], [(6, 10)], [-77])
    keep(cache, list(first))
    other_clip = position_keys([1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 9, 8], [(6, 10)], [-78])
    reuse = cache.claim(other_clip, [(6, 10)], want_hidden=False)
    assert reuse is not None and reuse.length == 6  # the clip differs: it is encoded again, whole
    keep(cache, list(first))
    reuse = cache.claim(first, [(6, 10)], want_hidden=False)
    assert reuse is not None and reuse.length == len(first) - 1  # the prompt's last row gives its logits


def test_kept_slots_are_given_back_least_recently_used_first() -> None:
    cache = small_cache(3)
    a, b, c = (keep(cache, [k] * 8) for k in (1, 2, 3))
    assert cache.kv.num_free == 0 and cache.num_free == 3
    assert cache.claim(np.asarray([1] * 8 + [5]), [], want_hidden=False).slot == a  # a is in use again
    fresh = cache.allocate()  # nothing free: the least recently kept entry goes
    assert fresh == b and set(cache.entries) == {c}
    assert cache.claim(np.asarray([2] * 8 + [5]), [], want_hidden=False) is None  # b's prefix is gone


# one kept entry of 8 positions: 2 layers x (keys, values) x 8 positions x 4 floats
ENTRY_BYTES = 2 * 2 * 8 * 4 * 4


def test_a_given_back_slot_moves_to_the_host_pool_and_comes_back_whole() -> None:
    cache = small_cache(2, host_bytes=10 * ENTRY_BYTES)
    a, b = keep(cache, [1] * 8), keep(cache, [2] * 8)
    held = [cache.kv.read(a, 8, layer) for layer in range(2)]
    cache.allocate()  # nothing free: a, the least recently kept, moves to the host
    assert set(cache.entries) == {b} and len(cache.host) == 1
    assert counted(cache) == {"slot": 0, "host": 0, "miss": 0, "to_host": 1, "dropped": 0, "bytes": ENTRY_BYTES}
    reuse = cache.claim(np.asarray([1] * 8 + [5]), [], want_hidden=False)  # a's conversation goes on
    assert reuse is not None and reuse.length == 8
    assert all(torch.equal(x, y) for layer in range(2)
               for x, y in zip(cache.kv.read(reuse.slot, 8, layer), held[layer], strict=True))
    # it continued a's prompt, so the pool let a go (as a slot would move); its slot was b's, now in the pool
    assert set(cache.entries) == set() and [e.keys[0] for e in cache.host.values()] == [2]
    assert counted(cache) == {"slot": 0, "host": 1, "miss": 0, "to_host": 2, "dropped": 0, "bytes": ENTRY_BYTES}


def test_a_shared_prefix_in_the_pool_is_copied_and_stays() -> None:
    cache = small_cache(2, host_bytes=10 * ENTRY_BYTES)
    keep(cache, [3] * 6 + [4, 4])
    keep(cache, [5] * 8)
    cache.allocate()
    reuse = cache.claim(np.asarray([3] * 6 + [9, 9]), [], want_hidden=False)
    assert reuse is not None and reuse.length == 6 and len(cache.host) == 2  # the first stays for others


def test_the_pool_drops_its_least_recently_used_past_its_bytes() -> None:
    cache = small_cache(1, host_bytes=ENTRY_BYTES)
    keep(cache, [1] * 8)
    keep(cache, [2] * 8)  # 1 goes to the pool
    keep(cache, [3] * 8)  # 2 goes to the pool, and 1 out of it
    assert counted(cache)["dropped"] == 1 and counted(cache)["bytes"] == ENTRY_BYTES
    assert cache.claim(np.asarray([1] * 8 + [5]), [], want_hidden=False) is None
    assert cache.claim(np.asarray([2] * 8 + [5]), [], want_hidden=False) is not None


def test_kept_prefixes_give_their_pages_to_new_sequences_when_the_pool_is_short() -> None:
    """Six pages of 16 for four slots of 64 positions: a sequence's pages come from free ones first, then from
    kept prefixes (least recently used first, to the host pool); a running sequence's pages are never taken."""
    cache = small_cache(4, host_bytes=10 * ENTRY_BYTES, pages=6)
    for first_token in (1, 2):
        keep(cache, [first_token] * 20)  # its reply's room given back: 2 pages each
    assert cache.kv.num_free_pages == 2 and cache.can_hold(64)
    first = cache.allocate()
    assert cache.reserve(first, 64) and cache.kv.capacity(first) == 64  # 2 free pages and a's 2
    assert [e.keys[0] for e in cache.entries.values()] == [2] and [e.keys[0] for e in cache.host.values()] == [1]
    second = cache.allocate()
    assert cache.reserve(second, 32) and not cache.entries  # b's pages
    third = cache.allocate()
    assert not cache.can_hold(16) and not cache.reserve(third, 16) and cache.kv.capacity(third) == 0
    cache.kv.free(first)
    assert cache.reserve(third, 16)


def test_the_pool_counts_its_pages_by_holder() -> None:
    cache = small_cache(3, pages=10)
    keep(cache, [1] * 20)  # kept: 2 pages
    running = cache.allocate()
    assert cache.reserve(running, 40)  # 3 pages
    cache.count_pages()
    assert {h: cache.metrics.kv_pages.labels(h)._value.get() for h in ("requests", "kept", "free")} == \
        {"requests": 3, "kept": 2, "free": 5}


def test_kept_rows_are_pieces_taken_without_copies() -> None:
    pieces = (torch.arange(6.0).view(3, 2), torch.arange(6.0, 14.0).view(4, 2))
    assert [p.shape[0] for p in head(pieces, 5)] == [3, 2]
    assert torch.equal(torch.cat(head(pieces, 5)), torch.cat(pieces)[:5])
    assert [p.shape[0] for p in head(pieces, 9)] == [3, 4] and head(pieces, 0) == ()
    # on the host already (a reused prefix's, or any on the CPU): kept as they are, but a few rows of a whole
    # step's, which would keep all of it
    assert [p.data_ptr() for p in host_rows(list(pieces))] == [p.data_ptr() for p in pieces]
    step = torch.zeros(64, 2)
    (kept,) = host_rows([step[:4]])
    assert torch.equal(kept, step[:4]) and kept.untyped_storage().nbytes() == kept.nbytes
    assert host_rows([]) is None  # a request that made no rows keeps none: a spoken prompt never takes its entry
