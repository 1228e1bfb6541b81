"""A batched, right-padded Thinker prefill equals prefilling each prompt alone (text and audio)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, WhisperFeatureExtractor

from engine.api import AudioPart, Message, TextPart
from engine.models.loader import load_stage
from engine.models.thinker_runner import ThinkerRunner
from engine.prompt import PromptBuilder


def test_batched_prefill_equals_one_by_one(tiny_checkpoint: Path) -> None:
    loaded = load_stage(tiny_checkpoint, "thinker", device="cpu", dtype="float32")
    builder = PromptBuilder(AutoTokenizer.from_pretrained(tiny_checkpoint),
                            WhisperFeatureExtractor.from_pretrained(tiny_checkpoint), n_window=50)
    tone = (0.2 * np.sin(np.arange(16_000) * 0.07)).astype(np.float32)
    prompts = [
        builder.build((Message("user", (TextPart("short"),)),)),
        builder.build((Message("user", (AudioPart(tone), TextPart("and a much longer question about it"))),)),
    ]
    with torch.inference_mode():
        runner = ThinkerRunner(loaded.model, loaded.config, max_batch=4, max_len=128)
        together = runner.prefill([0, 1], [p.token_ids for p in prompts], [p.audio_features for p in prompts], True)
        alone = [runner.prefill([2 + b], [p.token_ids], [p.audio_features], True)[0] for b, p in enumerate(prompts)]
        for t, a in zip(together, alone):
            assert t.embeds.shape == a.embeds.shape
            assert torch.allclose(t.logits, a.logits, atol=1e-4)
            assert torch.allclose(t.hidden, a.hidden, atol=1e-4)
        # and the caches they left decode alike
        lengths = [len(p.token_ids) for p in prompts]
        assert torch.allclose(runner.decode([0, 1], lengths, [5, 6]), runner.decode([2, 3], lengths, [5, 6]), atol=1e-4)
