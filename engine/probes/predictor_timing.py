"""What a frame of the code predictor costs on the GPU, in each form of its attention (`voice-gateway kernels`).

A frame is the Talker's 15 dependent passes, sampling included: with many speaking replies it is most of the
Talker's step, which bounds the voices one GPU serves. The predictor is full size with random bf16 weights,
compiled and graphed per batch as the engine runs it, timed over the graph's replays and its kernels counted
over one frame. Half the rows draw greedily, half sample with the Talker's defaults; codes equal to the torch
form's are recorded, not asserted (bf16 rounds differently in a fused kernel; float32 equality is tested in
tests/unit)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from engine.omni.accel.predictor_attention import predictor_attention
from engine.omni.runners.code_predictor import FrameAttention, StaticCodePredictor, frame_attention
from engine.omni.runners.replay import capture, median_replay_ms
from engine.omni.runners.sampler import RowSampling, RowTensors
from engine.omni.weights.full_size import build_dummy_stage

FORMS: dict[str, FrameAttention] = {"torch": frame_attention, "kernel": predictor_attention}
BATCHES = (1, 16, 64, 128)


@dataclass(frozen=True, slots=True)
class PredictorTiming:
    attention: str  # a FORMS key
    batch: int
    frame_ms: float  # one frame replayed from its graph, the median replay
    kernels: int  # the CUDA kernels one frame runs
    codes_equal_torch: float  # the share of this form's codes equal to the torch form's, same inputs and seeds

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def measure(batches: tuple[int, ...] | None = None, *, replays: int = 30, seed: int = 0) -> list[PredictorTiming]:
    """Every form at every batch (default BATCHES); needs a CUDA GPU (compiled Triton and graphs)."""
    if not torch.cuda.is_available():
        raise RuntimeError("timing the code predictor needs a CUDA GPU")
    talker: Any
    talker, _ = build_dummy_stage("talker", device="cuda", dtype="bfloat16", experts_on_meta=True)
    predictor, embedding = talker.code_predictor, talker.model.codec_embedding
    gen = torch.Generator(device="cuda").manual_seed(seed)
    inputs = {b: _inputs(b, embedding.embedding_dim, gen) for b in batches or BATCHES}
    timings: list[PredictorTiming] = []
    torch_codes: dict[int, torch.Tensor] = {}
    with torch.inference_mode():
        for name, attention in FORMS.items():
            form = StaticCodePredictor(predictor, embedding, compiled=True, attention=attention)
            for batch, (past, code0, rows) in inputs.items():
                frame = functools.partial(form, past, code0, rows)
                graph, (codes, _) = capture(frame, None, torch.cuda.Stream())
                graph.replay()
                codes = codes.clone()
                torch_codes.setdefault(batch, codes)
                timings.append(PredictorTiming(
                    name, batch, frame_ms=round(median_replay_ms(graph, replays), 3),
                    kernels=_kernel_count(frame),
                    codes_equal_torch=round(float((codes == torch_codes[batch]).float().mean()), 4),
                ))
                del graph  # its memory before the next capture
    return timings


def _inputs(batch: int, width: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, RowTensors]:
    rows = [RowSampling(temperature=0.9 if b % 2 else 0.0, top_p=0.8, top_k=50, seed=b, draws=3) for b in range(batch)]
    return (torch.randn(batch, width, device="cuda", generator=gen).bfloat16(),
            torch.randint(0, 2048, (batch,), device="cuda", generator=gen), RowTensors.of(rows, "cuda"))


def _kernel_count(frame: Callable[[], object]) -> int:
    """The kernels one frame launches, run outside a graph (a graph replays the same ones)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    # one cycle: accumulating says so, where torch 2.11 otherwise warns that a cycle's end clears its events
    with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as prof:
        frame()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
