"""What FP8 experts buy in time: our fused MoE kernels on bf16 and on FP8 experts at the released model's expert
shapes, for the token counts a step carries (`voice-gateway kernels`). Each call is captured in a CUDA graph, ten
to a graph, as the engine replays its steps (a call timed alone times its launches more than its kernels). The
weights are random, the routing uniform over the experts, eight a token, as the released model routes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from engine.omni.accel import fp8, fused_moe
from engine.omni.runners.replay import capture, median_replay_ms

# per stage: experts, their intermediate width, the hidden width (Qwen3-Omni-30B-A3B's Thinker and Talker)
SHAPES = {"thinker": (128, 768, 2048), "talker": (128, 384, 1024)}
TOP_K = 8
TOKENS = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096)
CALLS_PER_GRAPH = 10


@dataclass(frozen=True, slots=True)
class ExpertsTiming:
    stage: str
    tokens: int
    bf16_us: float  # one layer's experts, the median over the replays
    fp8_us: float
    quantize_us: float  # of the FP8 time: quantizing the layer's input (the down projection's input: as much again)

    @property
    def fp8_over_bf16(self) -> float:
        return self.fp8_us / self.bf16_us

    def as_dict(self) -> dict[str, float | int | str]:
        return {**asdict(self), "fp8_over_bf16": round(self.fp8_over_bf16, 3)}


def measure(tokens: tuple[int, ...] | None = None, *, replays: int = 30, seed: int = 0) -> list[ExpertsTiming]:
    """Every stage's experts at every token count (default TOKENS); needs a CUDA GPU (compiled Triton)."""
    if not torch.cuda.is_available():
        raise RuntimeError("timing the experts needs a CUDA GPU")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [timing for stage, shape in SHAPES.items() for timing in _stage(stage, shape, tokens or TOKENS, replays, gen)]


def _stage(stage: str, shape: tuple[int, int, int], tokens: tuple[int, ...], replays: int,
           gen: torch.Generator) -> list[ExpertsTiming]:
    experts, inter, hidden = shape
    gate_up = torch.randn(experts, 2 * inter, hidden, device="cuda", generator=gen) * 0.02
    down = torch.randn(experts, hidden, inter, device="cuda", generator=gen) * 0.02
    as_fp8 = fp8.quantize(gate_up), fp8.quantize(down)
    as_bf16 = gate_up.bfloat16(), down.bfloat16()
    del gate_up, down
    return [_timing(stage, n, as_bf16, as_fp8, replays, gen) for n in tokens]


def _timing(stage: str, n: int, as_bf16: tuple[torch.Tensor, torch.Tensor], as_fp8: tuple[tuple[torch.Tensor, ...], ...],
            replays: int, gen: torch.Generator) -> ExpertsTiming:
    (gate_up, down), ((gate_up_q, gate_up_s), (down_q, down_s)) = as_bf16, as_fp8
    experts, hidden = down.shape[0], gate_up.shape[2]
    x = torch.randn(n, hidden, device="cuda", generator=gen).bfloat16()
    weights, index = torch.topk(torch.randn(n, experts, device="cuda", generator=gen).softmax(-1), TOP_K)
    return ExpertsTiming(
        stage, n,
        bf16_us=_graphed(lambda: fused_moe.fused_experts(x, gate_up, down, index, weights), replays),
        fp8_us=_graphed(lambda: fused_moe.fused_experts(x, gate_up_q, down_q, index, weights, gate_up_scale=gate_up_s,
                                                        down_scale=down_s), replays),
        quantize_us=_graphed(lambda: fused_moe.quantize_rows(x), replays),
    )


def _graphed(call: Callable[[], object], replays: int) -> float:
    """Microseconds a call, from the median replay of a graph of CALLS_PER_GRAPH calls."""
    graph, _ = capture(lambda: [call() for _ in range(CALLS_PER_GRAPH)], None, torch.cuda.Stream())
    return round(median_replay_ms(graph, replays) * 1000 / CALLS_PER_GRAPH, 1)
