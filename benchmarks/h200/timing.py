"""Host wall time of GPU work, synced: what the H200 bench scripts time steps with."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def synced_ms(fn: Callable[[], object]) -> float:
    """One call, from a drained GPU to its last kernel done."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - t0)


def median_wall_ms(fn: Callable[[], object], iters: int = 10, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    return sorted(synced_ms(fn) for _ in range(iters))[iters // 2]
