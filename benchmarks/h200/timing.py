"""Host wall time of GPU work, synced, and the kernels it runs: what the H200 bench scripts measure steps with."""

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


def kernels(fn: Callable[[], object], top: int = 12) -> dict:
    """The CUDA kernels one call runs (replayed graphs' included): count, summed GPU time, and the
    `top` that take the most of it (what to fuse or tune next)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, list[float]] = {}
    for e in events:
        by_name.setdefault(e.name, []).append(e.device_time_total)
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {"kernels": len(events), "gpu_ms": sum(e.device_time_total for e in events) / 1000,
            "top_kernels": [{"name": n[:120], "count": len(t), "ms": round(sum(t) / 1000, 3)} for n, t in ranked]}
