"""What a runner replays instead of running a step eagerly, and how a step is captured.

CUDA graphs are applied from outside (engine/omni/accel/cuda_graphs.py): a runner is handed a
`Capture` at construction, calls it once with itself, and from then on replays what it got back
wherever a step fits; anything else runs eagerly. The eager path is the reference that the
graphed one is tested against.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from engine.metrics import EAGER_FALLBACK, ColdWork
from engine.omni.runners.packed_batch import Piece


class PackedReplay(Protocol):
    def __call__(self, embeds: torch.Tensor, pieces: list[Piece],
                 deepstack: torch.Tensor | None = None) -> tuple[torch.Tensor, ...] | None:
        """Packed rows [T, H] of these pieces, and the images' rows for the first decoder layers ([layers, T, H], zeros
        elsewhere); None when no bucket fits."""
        ...


class PredictorReplay(Protocol):
    def __call__(self, past_hidden: torch.Tensor, code0: torch.Tensor, rows: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
        ...


@dataclass(frozen=True, slots=True)
class StepGraphs:
    """A runner's captured steps; None where that step runs eagerly."""

    packed: PackedReplay | None = None  # any mix of prompt pieces and next tokens
    predictor: PredictorReplay | None = None


EAGER = StepGraphs()


def run_packed(graphs: StepGraphs, embeds: torch.Tensor, pieces: list[Piece], eager: Callable[[], Any],
               cold: ColdWork | None, what: str, deepstack: torch.Tensor | None = None) -> Any:
    """A packed step replayed where a graph's bucket fits it, else `eager()`, which with graphs is cold work (told to
    `cold` as `what`)."""
    if graphs.packed is not None:
        if (out := graphs.packed(embeds, pieces, deepstack)) is not None:
            return out
        if cold is not None:
            cold.record(EAGER_FALLBACK, f"{what}: no graph fits")
    return eager()


def capture(fn: Callable[[], Any], pool: Any, stream: torch.cuda.Stream) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Run `fn` twice on a side stream (lazy initialisation stays out of the graph), then capture it on `stream` into
    `pool` and replay it once, so that its upload to the device is not a request's wait; returns the graph and the
    outputs its replays overwrite."""
    side = torch.cuda.Stream(stream.device)
    side.wait_stream(torch.cuda.current_stream(stream.device))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(stream.device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        outputs = fn()
    graph.replay()  # its inputs are a capture's: zeros, and padding rows that write the scratch page
    return graph, outputs


def median_replay_ms(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    """The median of `replays` replays of a captured graph, by CUDA events (what the kernel timings report)."""
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
