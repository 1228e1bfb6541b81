"""The prompt builder's work on a long history (engine/intake/prompt.py): a long call sends its whole history's audio
every turn, and none of it is turned into features again while it fits the cache's bytes, nor hashed again, nor
its placeholders tokenized."""

from __future__ import annotations

import gc
import hashlib
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer, WhisperFeatureExtractor

from engine.api import AudioPart, Message, TextPart
from engine.intake import prompt as prompt_module
from engine.intake.prompt import PromptBuilder


@pytest.fixture
def builder(tiny_checkpoint: Path) -> PromptBuilder:
    return PromptBuilder(AutoTokenizer.from_pretrained(tiny_checkpoint),
                         WhisperFeatureExtractor.from_pretrained(tiny_checkpoint), n_window=50)


def history(turns: int) -> tuple[Message, ...]:
    rng = np.random.default_rng(0)
    messages = []
    for _ in range(turns):
        messages.append(Message("user", (AudioPart((0.1 * rng.standard_normal(4_000)).astype(np.float32)),)))
        messages.append(Message("assistant", (TextPart("sure"),)))
    return tuple(messages)


def counted(builder: PromptBuilder) -> list[int]:
    calls: list[int] = []
    features = builder._features
    builder._features = lambda samples: (calls.append(samples.size), features(samples))[1]  # type: ignore[method-assign]
    return calls


def test_a_long_history_is_featurized_once(builder: PromptBuilder) -> None:
    calls = counted(builder)
    messages = history(200)  # more clips than a count of 128 held
    first = builder.build(messages)
    assert len(calls) == 200
    again = builder.build((*messages, Message("user", (TextPart("and now?"),))))
    assert len(calls) == 200
    assert all((a == b).all() for a, b in zip(first.audio_features, again.audio_features, strict=True))


def test_the_oldest_features_go_past_the_bytes(builder: PromptBuilder, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = counted(builder)
    messages = history(10)
    one_clip = builder.build(messages[:1]).audio_features[0].nbytes
    monkeypatch.setattr(prompt_module, "RECENT_FEATURE_BYTES", 4 * one_clip)
    builder.build(messages)
    assert builder._recent_bytes <= 4 * one_clip and len(builder._recent) == 4
    calls.clear()
    builder.build(messages[-8:])  # the newest 4 clips are held
    assert calls == []
    builder.build(messages[:1])  # the oldest was dropped
    assert len(calls) == 1


def test_a_history_is_hashed_once_and_keys_stay_content_addressed(builder: PromptBuilder,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    hashed: list[int] = []
    blake2b = hashlib.blake2b
    monkeypatch.setattr(prompt_module.hashlib, "blake2b",
                        lambda data, **kw: (hashed.append(len(data)), blake2b(data, **kw))[1])
    messages = history(30)
    first = builder.build(messages)
    assert len(hashed) == 30
    new_clip = Message("user", (AudioPart(np.full(4_000, 0.25, dtype=np.float32)),))
    again = builder.build((*messages, new_clip))
    assert len(hashed) == 31  # the new clip alone
    assert again.audio_keys[:30] == first.audio_keys
    # the same samples in another array: hashed, the same key (prefix reuse matches content, not objects)
    copy = tuple(Message(m.role, tuple(AudioPart(p.samples.copy()) if isinstance(p, AudioPart) else p
                                       for p in m.content)) for m in messages)
    assert builder.build(copy).audio_keys == first.audio_keys and len(hashed) == 61
    # an array's entry goes with it
    held = len(builder._digests)
    del copy, messages, first, again
    gc.collect()
    assert len(builder._digests) <= held - 60


def test_placeholders_are_the_tokens_their_text_encodes_to(builder: PromptBuilder) -> None:
    prompt = builder.build(history(3))
    encoded = builder._encode(prompt_module.AUDIO_START + prompt_module.AUDIO_PAD * 13 + prompt_module.AUDIO_END)
    assert builder._placeholders((prompt_module.AUDIO_START, 1), (prompt_module.AUDIO_PAD, 13),
                                 (prompt_module.AUDIO_END, 1)) == encoded
    assert prompt.token_ids.count(encoded[1]) == prompt.audio_tokens
    # text that is not one token is tokenized as the repeated text would be
    assert builder._placeholders(("ab", 3)) == builder._encode("ababab")


def test_a_history_s_texts_are_tokenized_once_and_prompts_stay_equal(builder: PromptBuilder) -> None:
    """Each text of a history is tokenized once however many turns resend it (the template's pieces too), and a
    prompt built from remembered tokens is the one built afresh: callers extending what they were handed never
    change what is remembered."""
    def fresh(messages: tuple[Message, ...]) -> list[int]:
        return PromptBuilder(builder.tokenizer, builder.feature_extractor, n_window=50).build(messages).token_ids

    messages = tuple(Message(role, (TextPart(f"{role} {k}: the quick brown fox"),))
                     for k in range(20) for role in ("user", "assistant"))
    seen: list[str] = []
    tokenize = builder._tokenize
    builder._tokenize = lambda text, special: (seen.append(text), tokenize(text, special))[1]  # type: ignore[method-assign]
    builder._remembered = prompt_module.functools.lru_cache(maxsize=64)(builder._tokenize)
    first = builder.build(messages[:-2])
    calls = len(seen)
    again = builder.build(messages)
    assert seen[calls:] == ["user 19: the quick brown fox", "assistant 19: the quick brown fox"]  # the new turn's
    assert first.token_ids == fresh(messages[:-2]) and again.token_ids == fresh(messages)
    long = (Message("system", (TextPart("a long instruction " * (prompt_module.MAX_REMEMBERED_TEXT // 10)),)),)
    assert builder.build(long).token_ids == builder.build(long).token_ids == fresh(long)
