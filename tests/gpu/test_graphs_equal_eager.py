"""Graphed == eager: the code predictor, the Thinker's packed steps and the Talker's decode steps (with and
without compiled layers), the Talker's prefills, for the same inputs and seeds (the GPU lane; skipped
without CUDA)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.omni.runners.replay import EAGER, StepGraphs
from engine.omni.runners.sampler import RowSampling, RowTensors
from engine.omni.runners.talker import TalkerRow, TalkerRunner
from engine.omni.runners.thinker import StepRow
from engine.omni.weights.checkpoint import load_stage

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")


def test_graphed_code_predictor_equals_eager(tiny_checkpoint: Path) -> None:
    from engine.omni.accel.cuda_graphs import GraphedCodePredictor

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


@pytest.mark.parametrize("compiled", [False, True], ids=["layers", "compiled-layers"])
def test_graphed_packed_steps_equal_eager(tiny_checkpoint: Path, compiled: bool) -> None:
    """Decode rows alone, prompts beside decode rows, a prompt's later piece: each replayed from its token
    bucket equals the eager step; a bucket's spare tokens write only the scratch page."""
    import contextlib

    from engine.omni.accel import fused_moe
    from engine.omni.accel.cuda_graphs import GraphedPacked, compiled_layers
    from engine.omni.accel.packed_attention import KernelAttention
    from engine.omni.runners.packed_batch import Piece
    from engine.omni.runners.thinker import ThinkerRunner

    # bf16 as deployed: transformers' float32 grouped_mm path copies from the host, which a graph cannot hold
    loaded = load_stage(tiny_checkpoint, "thinker", device="cuda", dtype="bfloat16")
    with torch.inference_mode():
        fused_moe.enable(loaded.model)
        runner = ThinkerRunner(loaded.model, loaded.config, max_batch=8, max_len=128, attention=KernelAttention())
        hidden = runner.text_model.embed_tokens.embedding_dim
        with compiled_layers(runner.text_model.layers) if compiled else contextlib.nullcontext():
            graphed = GraphedPacked(runner.packed_step, runner.kv, runner.attention, hidden, runner.dtype,
                                    tokens=(1, 4, 16, 64), seqs=runner.max_batch, per_token=1)
        ids = [151644, 872, 198, 9707, 11, 1246, 525, 498, 30, 151645, 198, 151644, 77091, 198]
        steps = [
            [StepRow(0, ids), StepRow(1, ids[:9])],  # 23 tokens: the 64 bucket
            [StepRow(0, [1000], 14), StepRow(1, [2000], 9)],  # two decode rows: the 4 bucket
            [StepRow(2, ids[:5]), StepRow(0, [7], 15), StepRow(1, [8], 10)],  # a piece beside decode rows: 16
            [StepRow(2, ids[5:], 5), StepRow(0, [9], 16)],  # its later piece: 16
        ]
        eager = [runner.step(rows) for rows in steps]
        eager_keys = [runner.kv.read(slot, 17, 0)[0] for slot in range(3)]
        runner.kv.keys[0].zero_()
        runner.graphs = StepGraphs(packed=graphed)
        moved = {0: 3, 1: 4, 2: 5}  # the same steps in other slots
        replayed = [runner.step([StepRow(moved[r.slot], r.token_ids, r.start, r.audio) for r in rows]) for rows in steps]
        for got_step, want_step in zip(replayed, eager, strict=True):
            for got, want in zip(got_step, want_step, strict=True):
                assert torch.equal(got.embeds, want.embeds)
                # bf16 rounding only (a random model's near-ties may flip its argmax, so that is not compared)
                assert rel(got.logits, want.logits) < 2e-2 and rel(got.hidden, want.hidden) < 2e-2
        for slot in range(3):
            assert rel(runner.kv.read(moved[slot], 17, 0)[0], eager_keys[slot]) < 2e-2
        assert not runner.kv.keys[0][untouched(runner.kv)].any()  # spare tokens went to the scratch page alone
        assert graphed(torch.zeros(65, hidden, device="cuda", dtype=runner.dtype), [Piece(6, 0, 65)]) is None


def test_graphed_steps_with_an_image_equal_eager(tiny_checkpoint: Path, cache_dir: Path) -> None:
    """A prompt with an image beside a decode row, then its reply's first token beside another: replayed (the
    image's deepstack rows dense in the graph's input, zeros again after it) each equals the eager step."""
    from engine import ImagePart, Message, TextPart
    from engine.omni.accel import fused_moe
    from engine.omni.accel.cuda_graphs import GraphedPacked
    from engine.omni.accel.packed_attention import KernelAttention
    from engine.omni.runners.thinker import ThinkerRunner
    from engine.positions import Rope
    from tests.unit.test_vision import _engine, _image

    prompt = _engine(cache_dir).intake.prompts.build(
        (Message("user", (TextPart("What is in this picture?"), ImagePart(_image(64, 96, 5)))),))
    assert prompt.positions is not None and prompt.images
    n, rope = len(prompt.token_ids), Rope.of(prompt.positions)
    loaded = load_stage(tiny_checkpoint, "thinker", device="cuda", dtype="bfloat16")
    with torch.inference_mode():
        fused_moe.enable(loaded.model)
        runner = ThinkerRunner(loaded.model, loaded.config, max_batch=4, max_len=256, attention=KernelAttention())
        hidden = runner.text_model.embed_tokens.embedding_dim
        graphed = GraphedPacked(runner.packed_step, runner.kv, runner.attention, hidden, runner.dtype,
                                tokens=(4, 128), seqs=runner.max_batch, per_token=1, deepstack=runner.deepstack_layers)
        assert n + 1 <= 128
        ids = [151644, 872, 198, 9707, 11]

        def steps(image_slot: int, text_slot: int) -> list[list[StepRow]]:
            return [[StepRow(image_slot, prompt.token_ids, 0, (), tuple(prompt.images), rope.at(0, n)),
                     StepRow(text_slot, ids)],
                    [StepRow(image_slot, [1000], n, rope=rope.at(n, 1)), StepRow(text_slot, [7], len(ids))]]

        eager = [runner.step(rows) for rows in steps(0, 1)]
        runner.graphs = StepGraphs(packed=graphed)
        replayed = [runner.step(rows) for rows in steps(2, 3)]
        for got_step, want_step in zip(replayed, eager, strict=True):
            for got, want in zip(got_step, want_step, strict=True):
                assert torch.equal(got.embeds, want.embeds)
                assert rel(got.logits, want.logits) < 2e-2 and rel(got.hidden, want.hidden) < 2e-2
        assert graphed.deepstack is not None and not graphed.deepstack.any()  # zeros for the steps after
        # the comparison can tell: the step without the image's deepstack rows parts by more than the tolerance
        runner.graphs = EAGER
        runner.text_model._deepstack_process = lambda hidden_rows, mask, rows: hidden_rows
        blind = runner.step(steps(0, 1)[0])
        assert rel(blind[0].hidden, eager[0][0].hidden) > 2e-2


@pytest.mark.parametrize("compiled", [False, True], ids=["layers", "compiled-layers"])
def test_graphed_talker_steps_equal_eager(tiny_checkpoint: Path, compiled: bool) -> None:
    """Talker packed steps replayed per row bucket == eager: decode rows alone, a prompt beside decode rows,
    a prompt's later piece; spare rows write only the scratch page."""
    import contextlib

    from engine.omni.accel import fused_moe
    from engine.omni.accel.cuda_graphs import GraphedPacked, compiled_layers
    from engine.omni.accel.packed_attention import KernelAttention
    from engine.omni.runners.packed_batch import Piece

    talker = load_stage(tiny_checkpoint, "talker", device="cuda", dtype="bfloat16")
    with torch.inference_mode():
        fused_moe.enable(talker.model)
        talk = TalkerRunner(talker.model, talker.config, torch.randn(3, 64, device="cuda"), max_batch=8, max_len=64,
                            attention=KernelAttention())
        width = talk.codec_embedding.embedding_dim
        with compiled_layers(talk.talker.model.layers) if compiled else contextlib.nullcontext():
            graphed = GraphedPacked(talk.packed_step, talk.kv, talk.attention, width, talk.dtype, tokens=(1, 4, 16, 32),
                                    seqs=talk.max_batch, per_token=0)
        gen = torch.Generator(device="cuda").manual_seed(0)

        def rows(n: int) -> torch.Tensor:
            return torch.randn(n, width, device="cuda", dtype=talk.dtype, generator=gen)

        steps = [
            [TalkerRow(0, 0, rows(6)), TalkerRow(1, 0, rows(9))],  # 15 rows: the 16 bucket
            [TalkerRow(0, 6, rows(1)), TalkerRow(1, 9, rows(1))],  # two decode rows: the 4 bucket
            [TalkerRow(2, 0, rows(20)), TalkerRow(0, 7, rows(1)), TalkerRow(1, 10, rows(1))],  # 22: the 32 bucket
            [TalkerRow(2, 20, rows(3)), TalkerRow(0, 8, rows(1))],  # its later piece
        ]
        eager = [talk.step(step) for step in steps]
        eager_keys = [talk.kv.read(slot, 23, 0)[0] for slot in range(3)]
        talk.kv.keys[0].zero_()
        talk.graphs = StepGraphs(packed=graphed)
        moved = {0: 3, 1: 4, 2: 5}  # the same steps in other slots
        replayed = [talk.step([TalkerRow(moved[r.slot], r.start, r.embeds) for r in step]) for step in steps]
        for (g_logits, g_hidden), (logits, hidden) in zip(replayed, eager, strict=True):
            assert rel(g_logits, logits) < 2e-2 and rel(g_hidden, hidden) < 2e-2  # bf16 rounding only
        for slot in range(3):
            assert rel(talk.kv.read(moved[slot], 23, 0)[0], eager_keys[slot]) < 2e-2
        assert not talk.kv.keys[0][untouched(talk.kv)].any()  # spare rows went to the scratch page alone
        assert graphed(rows(33), [Piece(6, 0, 33)]) is None


def untouched(kv) -> list[int]:
    """The pages nothing wrote after the eager steps: those of slots 0-2 (zeroed, their steps replayed in slots
    3-5) and the free ones."""
    return [page for slot in (0, 1, 2) for page in kv.pages(slot)] + kv.free_pages


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def test_graphed_audio_tower_equals_transformers(tiny_checkpoint: Path) -> None:
    """The audio tower replayed from its bucket's graph == its padded layout run eagerly == transformers' forward."""
    import numpy as np
    from transformers import AutoTokenizer, WhisperFeatureExtractor

    from engine import AudioPart, Message
    from engine.intake.prompt import PromptBuilder
    from engine.omni.runners.audio_encoder import AudioEncoder

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
