"""Graphed code predictor == eager code predictor, for the same inputs and seeds (GPU only; skipped on CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.models.loader import load_stage
from engine.models.sampler import RowSampling, RowTensors
from engine.models.talker_runner import TalkerRunner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")


def test_graphed_code_predictor_equals_eager(tiny_checkpoint: Path) -> None:
    from engine.models.cuda_graphs import GraphedCodePredictor

    loaded = load_stage(tiny_checkpoint, "talker", device="cuda", dtype="float32")
    hidden = loaded.config.thinker_config.text_config.hidden_size
    with torch.inference_mode():
        runner = TalkerRunner(loaded.model, loaded.config, torch.randn(3, hidden), max_batch=8, max_len=64)
        graphed = GraphedCodePredictor(runner, buckets=(1, 4, 8))
        gen = torch.Generator(device="cuda").manual_seed(0)
        for n in (1, 3, 8):
            past = torch.randn(n, runner.codec_embedding.embedding_dim, device="cuda", generator=gen)
            code0 = torch.randint(0, 2048, (n,), device="cuda", generator=gen)
            rows = [RowSampling(temperature=0.9 if b % 2 else 0.0, top_p=0.8, top_k=50, seed=100 + b, draws=7)
                    for b in range(n)]
            settings = RowTensors.of(rows, "cuda")
            eager_codes, eager_total = runner.predict_residuals(past, code0, settings)
            out = graphed(past, code0, settings)
            assert out is not None
            codes, total = out
            assert torch.equal(codes, eager_codes), n
            assert torch.allclose(total, eager_total, atol=1e-5), n
        assert graphed(torch.zeros(9, past.shape[1], device="cuda"), torch.zeros(9, dtype=torch.long, device="cuda"),
                       RowTensors.of([rows[0]] * 9, "cuda")) is None  # larger than every bucket: eager
