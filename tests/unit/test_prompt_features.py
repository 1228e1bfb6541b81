"""The prompt builder's features of recent clips (engine/prompt.py): a long call sends its whole history's
audio every turn, and none of it is turned into features again while it fits the cache's bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer, WhisperFeatureExtractor

from engine import prompt as prompt_module
from engine.api import AudioPart, Message, TextPart
from engine.prompt import PromptBuilder


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
