"""Spreading one level's closed loop over client processes, each with its own event loop: with one process, a
burst of C sends queues on one Python loop, which is the client's time, not the server's."""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.config import BenchError

_START_TIMEOUT_S = 120

Started = Callable[[], Awaitable[Any]]
# work(job, indices, workers, started): make `workers` clients, await started(), run `indices`, return their records
Work = Callable[[Any, list[int], int, Started], Awaitable[list[Any]]]


def run_in_processes(work: Work, job: Any, n: int, concurrency: int, processes: int) -> tuple[list[Any], float]:
    """(records, wall s) of `n` work items run by `concurrency` workers in `processes` processes.

    Process p runs every P-th index with its share of the workers. `work` must be a module-level function and
    `job` picklable: the processes are spawned and import them. All start together (a barrier, once every client
    is made); the wall time runs from that start to the last one's end (perf_counter is one monotonic clock for
    all). The records come back in no particular order."""
    ctx = multiprocessing.get_context("spawn")
    count = min(processes, concurrency)
    start, results = ctx.Barrier(count + 1), ctx.Queue()
    procs = [ctx.Process(target=_process, daemon=True,
                         args=(work, job, list(range(p, n, count)), concurrency // count + (p < concurrency % count),
                               start, results))
             for p in range(count)]
    for proc in procs:
        proc.start()
    try:
        try:
            start.wait(timeout=_START_TIMEOUT_S)
        except threading.BrokenBarrierError:
            raise BenchError(f"{count} client processes did not all start within {_START_TIMEOUT_S} s") from None
        t0 = time.perf_counter()
        parts: list[tuple[list[Any], float]] = []
        while len(parts) < count:
            try:
                parts.append(results.get(timeout=1))
            except queue.Empty:
                if not any(proc.is_alive() for proc in procs) and results.empty():
                    raise BenchError("a client process ended without its records") from None
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    return [r for part, _ in parts for r in part], max(end for _, end in parts) - t0


def _process(work: Work, job: Any, indices: list[int], workers: int, start: Any, results: Any) -> None:
    async def run() -> tuple[list[Any], float]:
        records = await work(job, indices, workers, lambda: asyncio.to_thread(start.wait, _START_TIMEOUT_S))
        return records, time.perf_counter()

    results.put(asyncio.run(run()))
