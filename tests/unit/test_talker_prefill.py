"""A batched, right-padded Talker prefill equals prefilling each prompt alone, and decodes alike after."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.models.loader import load_stage
from engine.models.talker_runner import TalkerRunner


def test_batched_talker_prefill_equals_one_by_one(tiny_checkpoint: Path) -> None:
    loaded = load_stage(tiny_checkpoint, "talker", device="cpu", dtype="float32")
    gen = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        runner = TalkerRunner(loaded.model, loaded.config, torch.randn(3, 64, generator=gen), max_batch=4, max_len=64)
        prompts = [torch.randn(n, 64, generator=gen) for n in (9, 21)]
        logits, hidden = runner.prefill([0, 1], prompts)
        for b, prompt in enumerate(prompts):
            alone_logits, alone_hidden = runner.prefill([2 + b], [prompt])
            assert torch.allclose(logits[b], alone_logits[0], atol=1e-4)
            assert torch.allclose(hidden[b], alone_hidden[0], atol=1e-4)
        step = torch.randn(2, 64, generator=gen)
        lengths = [p.shape[0] for p in prompts]
        together = runner.decode([0, 1], lengths, step)[0]
        alone = runner.decode([2, 3], lengths, step)[0]
        assert torch.allclose(together, alone, atol=1e-4)
