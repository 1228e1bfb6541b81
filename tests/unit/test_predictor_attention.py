"""The code predictor's attention kernel (engine/omni/accel/predictor_attention.py) against its torch form
(engine/omni/runners/code_predictor.py's `frame_attention`), alone and inside a whole predictor.

On a CPU the kernel runs in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1), in float32; on
a GPU compiled, in bf16 as deployed, against the torch form in float32.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from engine.omni.accel.predictor_attention import predictor_attention  # noqa: E402
from engine.omni.runners.code_predictor import StaticCodePredictor, frame_attention  # noqa: E402
from engine.omni.runners.sampler import RowSampling, RowTensors  # noqa: E402
from engine.omni.weights.checkpoint import load_stage  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
TOLERANCE = 2e-2 if DTYPE == torch.bfloat16 else 1e-5


def _inputs(batch: int, heads: int, kv_heads: int, head_dim: int, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(DEVICE, DTYPE)

    positions = 16
    angles = torch.arange(positions)[:, None] * torch.rand(head_dim // 2, generator=gen)[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    # the frame buffer as the predictor holds it: every layer's [B, Hkv, positions, D] a view of one tensor
    keys, values = randn(3, batch, kv_heads, positions, head_dim), randn(3, batch, kv_heads, positions, head_dim)
    return dict(qkv=randn(batch, (heads + 2 * kv_heads) * head_dim), q_norm=randn(head_dim), k_norm=randn(head_dim),
                eps=1e-6, cos=angles.cos().to(DEVICE, DTYPE), sin=angles.sin().to(DEVICE, DTYPE), keys=keys[1],
                values=values[1], num_heads=heads, num_kv_heads=kv_heads, scale=head_dim**-0.5)


@pytest.mark.parametrize("position", [0, 1, 7, 15])
@pytest.mark.parametrize(("batch", "heads", "kv_heads", "head_dim"), [(1, 4, 2, 16), (3, 4, 2, 16), (2, 16, 8, 128)])
def test_kernel_equals_the_torch_form(position: int, batch: int, heads: int, kv_heads: int, head_dim: int) -> None:
    inputs = _inputs(batch, heads, kv_heads, head_dim, seed=position)
    at = torch.tensor([position], device=DEVICE)
    keys, values = inputs["keys"].clone(), inputs["values"].clone()
    got = predictor_attention(position=at, **inputs)
    as_float = {k: v.float() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    expected = frame_attention(position=at, **as_float)
    for name, a, b in zip(("output", "key", "value"), got, expected, strict=True):
        assert a.shape == b.shape and a.dtype == DTYPE, name
        assert torch.allclose(a.float(), b, atol=TOLERANCE, rtol=TOLERANCE), (name, (a.float() - b).abs().max())
    # read, never written; what lies at or past `position` is never read
    assert torch.equal(inputs["keys"], keys) and torch.equal(inputs["values"], values)
    inputs["keys"][:, :, position:] = float("nan")
    inputs["values"][:, :, position:] = float("nan")
    assert torch.equal(predictor_attention(position=at, **inputs)[0], got[0])


def test_a_predictor_on_the_kernel_draws_the_torch_forms_codes(tiny_checkpoint: Path) -> None:
    """Codes drawn with the kernel == with the torch form (held to transformers in test_static_predictor.py),
    greedy and sampled rows, fixed seeds; teacher-forced logits over the same frames agree."""
    loaded = load_stage(tiny_checkpoint, "talker", device=DEVICE, dtype="float32")
    predictor, embedding = loaded.model.code_predictor, loaded.model.model.codec_embedding
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    with torch.inference_mode():
        reference = StaticCodePredictor(predictor, embedding)
        kernel = StaticCodePredictor(predictor, embedding, attention=predictor_attention)
        past = torch.randn(5, embedding.embedding_dim, device=DEVICE, generator=gen)
        code0 = torch.randint(0, 2048, (5,), device=DEVICE, generator=gen)
        rows = RowTensors.of([RowSampling(temperature=0.9 if b % 2 else 0.0, top_p=0.8, top_k=50, seed=b, draws=3)
                              for b in range(5)], DEVICE)
        codes, total = kernel(past, code0, rows)
        expected_codes, expected_total = reference(past, code0, rows)
        assert torch.equal(codes, expected_codes)
        assert torch.allclose(total, expected_total, atol=1e-5)
        logits = kernel.teacher_forced_logits(past, codes)
        assert torch.allclose(logits, reference.teacher_forced_logits(past, codes), atol=1e-4, rtol=1e-4)
