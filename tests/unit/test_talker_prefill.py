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


def test_bucket_padded_prefill_step_equals_eager_prefill(tiny_checkpoint: Path) -> None:
    """What a graphed Talker prefill replays, run eagerly: padding to the bucket changes nothing."""
    from engine.models.kv_cache import SlotBatch

    loaded = load_stage(tiny_checkpoint, "talker", device="cpu", dtype="float32")
    gen = torch.Generator().manual_seed(4)
    with torch.inference_mode():
        runner = TalkerRunner(loaded.model, loaded.config, torch.randn(3, 64, generator=gen), max_batch=4, max_len=64)
        prompt = torch.randn(13, 64, generator=gen)
        logits, hidden = runner.prefill([0], [prompt])
        padded = torch.randn(1, 32, 64, generator=gen)
        padded[0, :13] = prompt
        view = SlotBatch(runner.kv, torch.tensor([1]), torch.tensor([0]), num_new=32, kv_len=32)
        step_logits, step_hidden = runner.prefill_step(padded, view, torch.tensor([12]))
        assert torch.allclose(step_logits, logits, atol=1e-4) and torch.allclose(step_hidden, hidden, atol=1e-4)
        step = torch.randn(1, 64, generator=gen)
        assert torch.allclose(runner.decode([0], [13], step)[0], runner.decode([1], [13], step)[0], atol=1e-4)
