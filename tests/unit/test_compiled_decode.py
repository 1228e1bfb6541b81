"""Decoder layers through torch.compile (`compiled_layers`, engine/omni/accel/cuda_graphs.py) == eager layers,
in their CPU form: the same Thinker and Talker packed steps, compiled by inductor for the CPU."""

from __future__ import annotations

from pathlib import Path

import torch
from torch._dynamo.utils import counters

from engine.omni.accel.cuda_graphs import compiled_layers
from engine.omni.runners.talker import TalkerRow, TalkerRunner
from engine.omni.runners.thinker import StepRow, ThinkerRunner
from engine.omni.weights.checkpoint import load_stage

PROMPT = [151644, 872, 198, 9707, 11, 1246, 525]


def test_compiled_thinker_and_talker_layers_decode_as_eager(tiny_checkpoint: Path) -> None:
    thinker = load_stage(tiny_checkpoint, "thinker", device="cpu", dtype="float32")
    talker = load_stage(tiny_checkpoint, "talker", device="cpu", dtype="float32")
    with torch.inference_mode():
        runner = ThinkerRunner(thinker.model, thinker.config, max_batch=4, max_len=64)
        runner.step([StepRow(s, ids) for s, ids in enumerate((PROMPT, PROMPT[:5], PROMPT[2:]))])
        rows = [StepRow(0, [1000], 7), StepRow(1, [2000], 5), StepRow(2, [3000], 5), StepRow(3, PROMPT)]
        eager = [out.logits for out in runner.step(rows)]
        layers = runner.text_model.layers
        graphs_before = counters["stats"]["unique_graphs"]
        with compiled_layers(layers):
            for n in (4, 3, 1):  # one token and more: two compilations, shared by every layer
                compiled = [out.logits for out in runner.step(rows[:n])]
                assert all(torch.allclose(c, e, atol=1e-4) for c, e in zip(compiled, eager, strict=False))
        # a few regions (the cache write between them), each for batch 1 and larger: not one set per layer
        assert counters["stats"]["unique_graphs"] - graphs_before < 4 * len(layers)
        assert all("forward" not in vars(layer) for layer in layers)  # the class's own forward again

        hidden = thinker.config.thinker_config.text_config.hidden_size
        talk = TalkerRunner(talker.model, talker.config, torch.randn(3, hidden), max_batch=4, max_len=64)
        width = talk.codec_embedding.embedding_dim
        gen = torch.Generator().manual_seed(0)
        talk.step([TalkerRow(s, 0, torch.randn(n, width, generator=gen)) for s, n in enumerate((6, 9))])
        rows = [TalkerRow(0, 6, torch.randn(1, width, generator=gen)), TalkerRow(1, 9, torch.randn(1, width, generator=gen)),
                TalkerRow(2, 0, torch.randn(5, width, generator=gen))]
        logits, last = talk.step(rows)
        with compiled_layers(talk.talker.model.layers):
            c_logits, c_last = talk.step(rows)
        assert torch.allclose(c_logits, logits, atol=1e-4) and torch.allclose(c_last, last, atol=1e-4)
