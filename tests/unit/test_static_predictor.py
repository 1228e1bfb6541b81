"""engine/omni/runners/code_predictor.py == transformers' code predictor, for the same inputs and seeds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.omni.runners.code_predictor import FrameAttention, StaticCodePredictor, frame_attention
from engine.omni.runners.sampler import RowSampling, RowTensors
from engine.omni.runners.talker import TalkerRunner
from engine.omni.weights.checkpoint import load_stage


def _rows(n: int, device: str) -> RowTensors:
    # greedy and sampled rows side by side, with counters well into a reply
    return RowTensors.of([RowSampling(temperature=0.9 if b % 2 else 0.0, top_p=0.8, top_k=50, seed=100 + b, draws=7)
                          for b in range(n)], device)


def _compare(tiny_checkpoint: Path, device: str, compiled: bool, atol: float) -> None:
    loaded = load_stage(tiny_checkpoint, "talker", device=device, dtype="float32")
    hidden = loaded.config.thinker_config.text_config.hidden_size
    with torch.inference_mode():
        runner = TalkerRunner(loaded.model, loaded.config, torch.randn(3, hidden), max_batch=8, max_len=64)
        static = StaticCodePredictor(loaded.model.code_predictor, runner.codec_embedding, compiled=compiled)
        gen = torch.Generator(device=device).manual_seed(0)
        for n in (1, 3, 8, 5):
            past = torch.randn(n, runner.codec_embedding.embedding_dim, device=device, generator=gen)
            code0 = torch.randint(0, 2048, (n,), device=device, generator=gen)
            expected_codes, expected_total = runner.predict_residuals(past, code0, _rows(n, device))
            codes, total = static(past, code0, _rows(n, device))
            assert torch.equal(codes, expected_codes), n
            assert torch.allclose(total, expected_total, atol=atol), n
        # a runner built with the static predictor hands its passes to it
        with_static = TalkerRunner(loaded.model, loaded.config, torch.randn(3, hidden), max_batch=8, max_len=64,
                                   predictor=static)
        assert torch.equal(with_static.predict_residuals(past, code0, _rows(5, device))[0], codes)


def test_static_predictor_equals_transformers(tiny_checkpoint: Path) -> None:
    _compare(tiny_checkpoint, "cpu", compiled=False, atol=1e-5)


def _teacher_forced(tiny_checkpoint: Path, device: str, compiled: bool,
                    attention: FrameAttention = frame_attention) -> tuple[torch.Tensor, torch.Tensor]:
    """Both predictors' logits for the same frames: transformers' in one forward over the frame."""
    loaded = load_stage(tiny_checkpoint, "talker", device=device, dtype="float32")
    predictor, codec_embedding = loaded.model.code_predictor, loaded.model.model.codec_embedding
    gen = torch.Generator(device=device).manual_seed(1)
    with torch.inference_mode():
        static = StaticCodePredictor(predictor, codec_embedding, compiled=compiled, attention=attention)
        past = torch.randn(6, codec_embedding.embedding_dim, device=device, generator=gen)
        codes = torch.randint(0, 2048, (6, static.num_groups), device=device, generator=gen)
        embeds = [codec_embedding(codes[:, 0]), *(predictor.model.codec_embedding[g](codes[:, g + 1]) for g in range(14))]
        hidden = predictor.model(inputs_embeds=torch.stack([past, *embeds], dim=1)).last_hidden_state
        expected = torch.stack([predictor.lm_head[g](hidden[:, g + 1]) for g in range(15)], dim=1)
        return static.teacher_forced_logits(past, codes), expected


def test_static_predictor_logits_equal_transformers(tiny_checkpoint: Path) -> None:
    logits, expected = _teacher_forced(tiny_checkpoint, "cpu", compiled=False)
    assert torch.allclose(logits, expected, atol=1e-5, rtol=1e-5), (logits - expected).abs().max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.compile's Triton kernels need a CUDA GPU")
@pytest.mark.filterwarnings("ignore:TensorFloat32")  # inductor's advice; float32 stays exact here on purpose
@pytest.mark.parametrize("kernel", [False, True], ids=["torch-attention", "attention-kernel"])
def test_compiled_static_predictor_on_cuda(tiny_checkpoint: Path, kernel: bool) -> None:
    """On a GPU, other kernels round differently, and a sampled code can flip on a near-tie: the
    compiled step's logits are compared over the same frames, and its CUDA graph with itself."""
    from engine.omni.accel.cuda_graphs import GraphedCodePredictor
    from engine.omni.accel.predictor_attention import predictor_attention

    attention = predictor_attention if kernel else frame_attention
    logits, expected = _teacher_forced(tiny_checkpoint, "cuda", compiled=True, attention=attention)
    assert torch.allclose(logits, expected, atol=1e-4, rtol=1e-4), (logits - expected).abs().max()
    loaded = load_stage(tiny_checkpoint, "talker", device="cuda", dtype="float32")
    hidden = loaded.config.thinker_config.text_config.hidden_size
    with torch.inference_mode():
        static = StaticCodePredictor(loaded.model.code_predictor, loaded.model.model.codec_embedding, compiled=True,
                                     attention=attention)
        runner = TalkerRunner(loaded.model, loaded.config, torch.randn(3, hidden), max_batch=8, max_len=64,
                              predictor=static)
        graphed = GraphedCodePredictor(runner, buckets=(1, 8))
        for n in (1, 5):
            past = torch.randn(n, runner.codec_embedding.embedding_dim, device="cuda")
            code0 = torch.randint(0, 2048, (n,), device="cuda")
            codes, total = runner.predict_residuals(past, code0, _rows(n, "cuda"))
            graphed_codes, graphed_total = graphed(past, code0, _rows(n, "cuda"))
            assert torch.equal(graphed_codes, codes) and torch.equal(graphed_total, total), n


def test_fused_weights_are_shared_with_transformers(tiny_checkpoint: Path) -> None:
    """q/k/v and gate/up become one GEMM each without a second copy of the weights."""
    loaded = load_stage(tiny_checkpoint, "talker", device="cpu", dtype="float32")
    attn = loaded.model.code_predictor.model.layers[0].self_attn
    before = attn.k_proj.weight.detach().clone()
    static = StaticCodePredictor(loaded.model.code_predictor, loaded.model.model.codec_embedding)
    layer = static.layers[0]
    assert attn.k_proj.weight.data_ptr() == layer.qkv[attn.q_proj.weight.shape[0] :].data_ptr()
    assert torch.equal(attn.k_proj.weight, before)


def test_a_step_reads_the_frame_buffer_and_never_writes_it(tiny_checkpoint: Path) -> None:
    """The compiled step must not write its KV buffer (inductor copies a written graph input whole, every
    step); it hands back the position's key and value, which a step at the next position then attends to."""
    loaded = load_stage(tiny_checkpoint, "talker", device="cpu", dtype="float32")
    static = StaticCodePredictor(loaded.model.code_predictor, loaded.model.model.codec_embedding)
    with torch.inference_mode():
        past = torch.randn(3, loaded.model.model.codec_embedding.embedding_dim)
        keys, values = static._start_frame(past)
        # position 0 written by the caller
        assert keys[:, :, :, 0].abs().sum() > 0 and keys[:, :, :, 1:].abs().sum() == 0
        before = keys.clone(), values.clone()
        step_input = static.embeddings[0](torch.tensor([1, 2, 3]))
        hidden, key, value = static.step(step_input, static.position_ids[1], keys, values)
        assert torch.equal(keys, before[0]) and torch.equal(values, before[1])
        assert key.shape == value.shape == (len(static.layers), 3, static.num_kv_heads, static.head_dim)
