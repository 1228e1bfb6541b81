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


def test_bucket_padded_prefill_step_equals_eager_prefill(tiny_checkpoint: Path) -> None:
    """What a graphed prefill replays (engine/models/cuda_graphs.py), run eagerly: a prompt padded to
    its bucket gives the same logits, captured rows and decode as the plain prefill."""
    from engine.models.kv_cache import SlotBatch

    loaded = load_stage(tiny_checkpoint, "thinker", device="cpu", dtype="float32")
    builder = PromptBuilder(AutoTokenizer.from_pretrained(tiny_checkpoint),
                            WhisperFeatureExtractor.from_pretrained(tiny_checkpoint), n_window=50)
    ids = builder.build((Message("user", (TextPart("a prompt shorter than its bucket"),)),)).token_ids
    with torch.inference_mode():
        runner = ThinkerRunner(loaded.model, loaded.config, max_batch=4, max_len=128)
        plain = runner.prefill([0], [ids], [[]], True)[0]
        bucket = 64
        assert len(ids) < bucket
        padded = torch.randn(1, bucket, runner.text_model.embed_tokens.embedding_dim)  # junk past the prompt
        padded[0, : len(ids)] = runner.embed(ids)
        view = SlotBatch(runner.kv, torch.tensor([1]), torch.tensor([0]), num_new=bucket, kv_len=bucket)
        logits, hidden = runner.prefill_step(padded, view, torch.tensor([len(ids) - 1]))
        assert torch.allclose(logits[0], plain.logits, atol=1e-4)
        assert torch.allclose(hidden[0, : len(ids)], plain.hidden, atol=1e-4)
        # the junk keys past the prompt are overwritten by decode before anything reads them
        assert torch.allclose(runner.decode([0], [len(ids)], [7]), runner.decode([1], [len(ids)], [7]), atol=1e-4)
