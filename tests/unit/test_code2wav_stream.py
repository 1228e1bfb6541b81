"""Stateful streaming Code2Wav equals the one-shot decode, whatever the chunking and batching."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.omni.runners.code2wav import StreamBatch, StreamingCode2Wav
from engine.omni.weights.checkpoint import load_stage
from engine.omni.weights.full_size import full_size_config_dict


def _codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (16, frames), generator=torch.Generator().manual_seed(seed))


def _wide_window_model() -> torch.nn.Module:
    """Code2Wav with the released model's 72-frame window (small widths): carried attention state matters."""
    from transformers import Qwen3OmniMoeCode2Wav, Qwen3OmniMoeConfig

    config = Qwen3OmniMoeConfig(**full_size_config_dict()).code2wav_config
    for key, value in dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, decoder_dim=64).items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = Qwen3OmniMoeCode2Wav._from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # SnakeBeta starts at alpha = beta = 1; perturb so every parameter matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


@pytest.fixture(scope="module", params=["tiny", "wide-window"])
def model(request, tiny_checkpoint: Path) -> torch.nn.Module:
    if request.param == "tiny":
        return load_stage(tiny_checkpoint, "code2wav", device="cpu", dtype="float32").model
    return _wide_window_model()


def _stream(stream: StreamingCode2Wav, replies: list[torch.Tensor], chunkings: list[list[int]]) -> list[torch.Tensor]:
    """Feed each reply's chunks; at every step, batch the next chunk of every reply that has one left."""
    audio: list[list[torch.Tensor]] = [[] for _ in replies]
    done = [0] * len(replies)
    step = 0
    while any(step < len(c) for c in chunkings):
        rows = [b for b, c in enumerate(chunkings) if step < len(c)]
        sizes = [chunkings[b][step] for b in rows]
        codes = torch.zeros(len(rows), 16, max(sizes), dtype=torch.long, device=replies[0].device)
        for i, (b, n) in enumerate(zip(rows, sizes, strict=True)):
            codes[i, :, :n] = replies[b][:, done[b] : done[b] + n]
        batch = StreamBatch(codes, torch.tensor(rows) * 3 + 1, torch.tensor(sizes), torch.tensor([done[b] for b in rows]))
        wav, valid = stream.decode(batch)
        for i, b in enumerate(rows):
            audio[b].append(wav[i, : valid[i]])
            done[b] += sizes[i]
        step += 1
    return [torch.cat(a) for a in audio]


@pytest.mark.parametrize("buckets", [{}, {"batch_buckets": (2, 8), "frame_buckets": (4, 25)}],
                         ids=["exact-shapes", "padded-to-buckets"])
def test_streamed_chunks_join_into_the_one_shot_decode(model: torch.nn.Module, buckets: dict) -> None:
    frames = [37, 90, 5, 1]
    replies = [_codes(n, seed=n) for n in frames]
    chunkings = [[4, 25, 8], [1, 1, 30, 25, 33], [2, 3], [1]]
    assert [sum(c) for c in chunkings] == frames
    stream = StreamingCode2Wav(model, num_slots=12, **buckets)
    if buckets:
        assert stream.warm_up() == 4  # and the scratch slot's garbage must not leak into any reply
    with torch.inference_mode():
        whole = [model(r[None])[0, 0].clamp(-1, 1) for r in replies]
        streamed = _stream(stream, replies, chunkings)
    for w, s in zip(whole, streamed, strict=True):
        assert s.shape == w.shape
        assert (s - w).abs().max().item() <= 1e-4 * max(w.abs().max().item(), 1e-3)


def test_a_reused_slot_starts_clean(model: torch.nn.Module) -> None:
    stream = StreamingCode2Wav(model, num_slots=12)
    first, second = _codes(30, seed=1), _codes(12, seed=2)
    with torch.inference_mode():
        _stream(stream, [first], [[10, 20]])
        again = _stream(stream, [second], [[5, 7]])[0]  # same slot (1), new reply
        whole = model(second[None])[0, 0]
    assert (again - whole).abs().max().item() <= 1e-4 * whole.abs().max().item()


def test_lost_state_is_detectably_wrong(model: torch.nn.Module) -> None:
    """Guards the tests above: decoding a later chunk as if fresh gives a different waveform."""
    stream = StreamingCode2Wav(model, num_slots=4)
    codes = _codes(40, seed=3)
    with torch.inference_mode():
        whole = model(codes[None])[0, 0]
        wav, valid = stream.decode(StreamBatch(codes[None, :, 20:], torch.tensor([0]), torch.tensor([20]), torch.tensor([0])))
    tail = whole[20 * 1920 :][: valid[0]]  # where those samples sit in the one-shot decode
    assert (wav[0, : tail.shape[0]] - tail).abs().max().item() > 0.05 * tail.abs().max().item()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_full_size_bf16_on_gpu_streams_like_the_one_shot_decode() -> None:
    """In bf16 neither decode is exact: the streamed one must be as close to float32 as the one-shot is."""
    import copy

    from engine.omni.weights.full_size import build_dummy_stage

    model, _ = build_dummy_stage("code2wav", device="cuda", dtype="bfloat16")
    reference_model = copy.deepcopy(model).float()
    codes = _codes(125, seed=7).cuda()
    stream = StreamingCode2Wav(model, num_slots=4)
    with torch.inference_mode():
        reference = reference_model(codes[None])[0, 0].clamp(-1, 1)
        one_shot = model(codes[None])[0, 0].float().clamp(-1, 1)
        streamed = _stream(stream, [codes], [[4, 25, 25, 25, 25, 21]])[0]
    assert streamed.shape == one_shot.shape == reference.shape

    def snr_db(x: torch.Tensor) -> float:
        return 10 * torch.log10(reference.pow(2).sum() / (x - reference).pow(2).sum().clamp_min(1e-20)).item()

    print(f"SNR against float32: bf16 one-shot {snr_db(one_shot):.1f} dB, bf16 streamed {snr_db(streamed):.1f} dB")
    assert snr_db(streamed) >= snr_db(one_shot) - 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_graphed_bucket_steps_equal_eager_ones(tiny_checkpoint: Path) -> None:
    model = load_stage(tiny_checkpoint, "code2wav", device="cuda", dtype="float32").model
    buckets = {"batch_buckets": (2, 8), "frame_buckets": (4, 25)}
    eager, graphed = StreamingCode2Wav(model, num_slots=12, **buckets), StreamingCode2Wav(model, num_slots=12, **buckets)
    assert graphed.capture_graphs() == 4
    frames = [37, 90, 5, 1]
    replies = [_codes(n, seed=n).cuda() for n in frames]
    chunkings = [[4, 25, 8], [1, 1, 30, 25, 33], [2, 3], [1]]
    with torch.inference_mode():
        for e, g in zip(_stream(eager, replies, chunkings), _stream(graphed, replies, chunkings), strict=True):
            assert torch.allclose(e, g, atol=1e-5)
