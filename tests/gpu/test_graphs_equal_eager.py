"""Graphed == eager: the code predictor, decode steps (with and without compiled layers) and prefills,
for the same inputs and seeds (the GPU lane; skipped without CUDA)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.runners.replay import EAGER, StepGraphs
from engine.runners.sampler import RowSampling, RowTensors
from engine.runners.talker import TalkerRunner
from engine.runners.thinker import PrefillRow
from engine.weights.checkpoint import load_stage

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")


def test_graphed_code_predictor_equals_eager(tiny_checkpoint: Path) -> None:
    from engine.accel.cuda_graphs import GraphedCodePredictor

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


@pytest.mark.parametrize(("kernels", "compiled"), [(False, False), (True, False), (True, True)],
                         ids=["sdpa-grouped-mm", "triton-kernels", "triton-kernels-compiled-layers"])
def test_graphed_decode_steps_equal_eager(tiny_checkpoint: Path, kernels: bool, compiled: bool) -> None:
    import contextlib

    from engine.accel.cuda_graphs import GraphedDecode, compiled_layers
    from engine.runners.thinker import ThinkerRunner

    # bf16 as deployed: transformers' float32 grouped_mm path copies from the host, which a graph cannot hold
    loaded = load_stage(tiny_checkpoint, "thinker", device="cuda", dtype="bfloat16")
    with torch.inference_mode():
        runner = ThinkerRunner(loaded.model, loaded.config, max_batch=4, max_len=64)
        if kernels:
            from engine.accel import fused_moe, slot_attention

            fused_moe.enable(loaded.model)
            slot_attention.enable(runner.text_model)
            runner.kv.decode_kernel = True
        hidden = runner.text_model.embed_tokens.embedding_dim
        with compiled_layers(runner.text_model.layers) if compiled else contextlib.nullcontext():
            graphed = GraphedDecode(runner.decode_step, runner.kv, hidden, runner.dtype, buckets=(1, 2, 4))
        prompts = {0: [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198], 2: [151644, 872, 198, 151644, 77091, 198]}
        runner.prefill([PrefillRow(slot, ids) for slot, ids in prompts.items()], want_hidden=False)
        slots, positions, tokens = [0, 2], [len(prompts[0]), len(prompts[2])], [1000, 2000]
        embeds = runner.text_model.embed_tokens(torch.tensor(tokens, device="cuda")).unsqueeze(1)
        eager = runner.decode_step(embeds, runner.kv.batch(slots, positions, 1))[0]
        out = graphed(embeds, slots, positions)
        assert out is not None and out[0].shape == eager.shape
        # the graph attends over the whole (masked) cache, eager over the written part: bf16 rounding only
        assert (out[0].float() - eager.float()).norm() / eager.float().norm() < 2e-2
        assert torch.equal(out[0].argmax(-1), eager.argmax(-1))
        # the padding row of a 3-row batch in the 4 bucket wrote only to the scratch slot
        before = runner.kv.keys[0][1].clone()
        graphed(torch.cat([embeds, embeds[:1]]), [0, 2, 3], positions + [0])
        assert torch.equal(runner.kv.keys[0][1], before)


def test_graphed_prefills_equal_eager(tiny_checkpoint: Path) -> None:
    from engine.accel import fused_moe
    from engine.accel.cuda_graphs import GraphedPrefill
    from engine.runners.thinker import ThinkerRunner

    thinker = load_stage(tiny_checkpoint, "thinker", device="cuda", dtype="bfloat16")
    talker = load_stage(tiny_checkpoint, "talker", device="cuda", dtype="bfloat16")
    with torch.inference_mode():
        fused_moe.enable(thinker.model)  # capturable in any dtype
        fused_moe.enable(talker.model)
        runner = ThinkerRunner(thinker.model, thinker.config, max_batch=8, max_len=128)
        ids = [151644, 872, 198, 9707, 11, 1246, 525, 498, 30, 151645, 198, 151644, 77091, 198]
        group = [ids, ids[:9], ids[3:]]
        eager = runner.prefill([PrefillRow(s, ids) for s, ids in zip((0, 2, 4), group, strict=True)], want_hidden=True)
        eager_keys = runner.kv.keys[0][[0, 2, 4], :, :14].clone()
        hidden_size = runner.text_model.embed_tokens.embedding_dim
        # (4, 16) holds the group with one padding prompt; (2, 16) alone would split it in two runs;
        # (3, 16), a fine bucket, holds it exactly
        for batches in ((1, 2, 4), (1, 2), (1, 2, 3)):
            runner.kv.keys[0].zero_()
            prefill = GraphedPrefill(runner.prefill_step, runner.kv, hidden_size, runner.dtype,
                                     lengths=(16, 64), batches=batches, max_tokens=64)
            runner.graphs = StepGraphs(prefill=prefill)
            assert (4, 64, 64) not in prefill.buckets  # over max_tokens
            graphed_outs = runner.prefill([PrefillRow(s, ids) for s, ids in zip((1, 3, 5), group, strict=True)], want_hidden=True)
            for graphed, expected in zip(graphed_outs, eager, strict=True):
                assert torch.equal(graphed.embeds, expected.embeds)
                assert rel(graphed.logits, expected.logits) < 2e-2 and rel(graphed.hidden, expected.hidden) < 2e-2
            for real, n in zip((1, 3, 5), map(len, group), strict=True):
                assert rel(runner.kv.keys[0][real, :, :n], eager_keys[(real - 1) // 2, :, :n]) < 2e-2
            # the padding prompt wrote only the scratch slot
            assert not runner.kv.keys[0][[0, 2, 4, 6, 7]].any()
        single = runner.prefill([PrefillRow(6, ids)], want_hidden=True)[0]  # replayed from the (1, 16) bucket
        assert rel(single.logits, eager[0].logits) < 2e-2
        assert runner.prefill([PrefillRow(2, ids * 5)], want_hidden=False)[0].logits.shape == eager[0].logits.shape  # eager

        # one prompt a replay at 64 rows: the short prompts' runs replay the 16-row bucket, their rows padded to 42
        mixed = [ids * 3, ids, ids[:9]]
        runner.graphs = EAGER
        expected_outs = runner.prefill([PrefillRow(s, p) for s, p in zip((0, 2, 4), mixed, strict=True)], want_hidden=True)
        runner.graphs = StepGraphs(prefill=GraphedPrefill(runner.prefill_step, runner.kv, hidden_size, runner.dtype,
                                                          lengths=(16, 64), batches=(1, 2), max_tokens=64))
        mixed_outs = runner.prefill([PrefillRow(s, p) for s, p in zip((1, 3, 5), mixed, strict=True)], want_hidden=True)
        for graphed, expected in zip(mixed_outs, expected_outs, strict=True):
            assert rel(graphed.logits, expected.logits) < 2e-2 and rel(graphed.hidden, expected.hidden) < 2e-2

        talk = TalkerRunner(talker.model, talker.config, torch.randn(3, 64, device="cuda"), max_batch=4, max_len=64)
        prompts = [torch.randn(n, talk.codec_embedding.embedding_dim, device="cuda", dtype=talk.dtype) for n in (13, 20)]
        logits, hidden = talk.prefill([0, 2], prompts)
        talk.graphs = StepGraphs(prefill=GraphedPrefill(talk.prefill_step, talk.kv, prompts[0].shape[-1], talk.dtype,
                                                        (16, 32), batches=(1, 2)))
        g_logits, g_hidden = talk.prefill([1, 3], prompts)
        for b in range(2):
            assert rel(g_logits[b], logits[b]) < 2e-2 and rel(g_hidden[b], hidden[b]) < 2e-2
        # one prompt a replay at 32 rows: the 10-row prompt's run replays the 16-row bucket, its rows padded to 30
        prompts = [torch.randn(n, talk.codec_embedding.embedding_dim, device="cuda", dtype=talk.dtype) for n in (30, 10)]
        talk.graphs = EAGER
        logits, hidden = talk.prefill([0, 2], prompts)
        talk.graphs = StepGraphs(prefill=GraphedPrefill(talk.prefill_step, talk.kv, prompts[0].shape[-1], talk.dtype,
                                                        (16, 32), batches=(1, 2), max_tokens=32))
        g_logits, g_hidden = talk.prefill([1, 3], prompts)
        for b in range(2):
            assert rel(g_logits[b], logits[b]) < 2e-2 and rel(g_hidden[b], hidden[b]) < 2e-2


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def test_graphed_extends_equal_eager(tiny_checkpoint: Path) -> None:
    """Rows after a prefix already in the slot (a conversation's next turn, a long prompt's later pieces),
    replayed from extend graphs, equal the eager extend and the whole prefill."""
    from engine.accel import fused_moe
    from engine.accel.cuda_graphs import GraphedPrefill
    from engine.runners.thinker import ThinkerRunner

    thinker = load_stage(tiny_checkpoint, "thinker", device="cuda", dtype="bfloat16")
    with torch.inference_mode():
        fused_moe.enable(thinker.model)
        runner = ThinkerRunner(thinker.model, thinker.config, max_batch=8, max_len=256)
        ids = [151644, 872, 198, 9707, 11, 1246, 525, 498, 30, 151645, 198, 151644, 77091, 198] * 5
        cuts = (30, 47)
        whole = runner.prefill([PrefillRow(s, ids) for s in (0, 1)], want_hidden=True)
        runner.prefill([PrefillRow(s, ids[:cut]) for s, cut in zip((2, 3), cuts, strict=True)], want_hidden=True)
        eager = runner.prefill([PrefillRow(s, ids[cut:], cut) for s, cut in zip((2, 3), cuts, strict=True)], want_hidden=True)
        hidden_size = runner.text_model.embed_tokens.embedding_dim
        runner.graphs = StepGraphs(extend=GraphedPrefill(runner.prefill_step, runner.kv, hidden_size, runner.dtype,
                                                         lengths=(32, 64), batches=(1, 2), reach=(128, 256)))
        runner.prefill([PrefillRow(s, ids[:cut]) for s, cut in zip((4, 5), cuts, strict=True)], want_hidden=True)
        graphed = runner.prefill([PrefillRow(s, ids[cut:], cut) for s, cut in zip((4, 5), cuts, strict=True)], want_hidden=True)
        for g, e, w, cut in zip(graphed, eager, whole, cuts, strict=True):
            assert rel(g.logits, e.logits) < 2e-2 and rel(g.hidden, e.hidden) < 2e-2
            assert rel(g.logits, w.logits) < 2e-2 and rel(g.hidden, w.hidden[cut:]) < 2e-2
        n = len(ids)
        assert rel(runner.decode([4, 5], [n, n], [7, 9]), runner.decode([0, 1], [n, n], [7, 9])) < 2e-2


def test_graphed_audio_tower_equals_transformers(tiny_checkpoint: Path) -> None:
    """The audio tower replayed from its bucket's graph == its padded layout run eagerly == transformers' forward."""
    import numpy as np
    from transformers import AutoTokenizer, WhisperFeatureExtractor

    from engine import AudioPart, Message
    from engine.prompt import PromptBuilder
    from engine.runners.audio_encoder import AudioEncoder

    thinker = load_stage(tiny_checkpoint, "thinker", device="cuda", dtype="float32")
    builder = PromptBuilder(AutoTokenizer.from_pretrained(tiny_checkpoint),
                            WhisperFeatureExtractor.from_pretrained(tiny_checkpoint), n_window=50)
    tone = lambda s: (0.2 * np.sin(np.arange(int(16_000 * s)) * 0.05)).astype(np.float32)  # noqa: E731
    clips = [builder.build((Message("user", (AudioPart(tone(s)),)),)).audio_features[0] for s in (0.7, 2.4, 9.3)]
    with torch.inference_mode():
        encoder = AudioEncoder(thinker.model, buckets=(16, 32, 96), graphed=True)
        encoder.warm_up()
        assert sorted(encoder.graphs) == [16, 32]  # 96 chunks: transformers' forward
        reference = encoder._encode(clips)
        graphed = encoder(clips, reference.shape[0])
        encoder.graphs.clear()
        eager = encoder(clips, reference.shape[0])
    assert torch.allclose(graphed, eager, atol=1e-4)
    assert torch.allclose(eager, reference, atol=1e-3)
