"""Stage reports reach the event loop in order, many per wake-up (engine/orchestrator.py)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

from engine.orchestrator import Orchestrator


@dataclass(frozen=True)
class Report:
    request_id: str
    seq: int


def test_reports_from_many_threads_arrive_in_order_with_few_wake_ups() -> None:
    # only the report path: no model, no stages
    orchestrator = Orchestrator(info=None, profile=None, prompt_builder=None, stages={},  # type: ignore[arg-type]
                                metrics=type("Metrics", (), {"registry": None})(), has_talker=False)
    seen: list[Report] = []
    wake_ups = 0
    drain = orchestrator._drain_reports

    def counted_drain() -> None:
        nonlocal wake_ups
        wake_ups += 1
        drain()

    orchestrator._on_report = seen.append  # type: ignore[method-assign]
    orchestrator._drain_reports = counted_drain  # type: ignore[method-assign]
    threads, per_thread = 4, 2000

    async def run() -> None:
        orchestrator._loop = asyncio.get_running_loop()

        def stage(name: str) -> None:
            for i in range(per_thread):
                orchestrator._report_threadsafe(Report(name, i))

        workers = [threading.Thread(target=stage, args=(f"s{t}",)) for t in range(threads)]
        for w in workers:
            w.start()
        while any(w.is_alive() for w in workers) or orchestrator._reports or orchestrator._drain_scheduled:
            await asyncio.sleep(0.001)
        for w in workers:
            w.join()

    asyncio.run(run())
    assert len(seen) == threads * per_thread  # nothing lost
    for t in range(threads):
        assert [r.seq for r in seen if r.request_id == f"s{t}"] == list(range(per_thread))  # each thread's order
    assert 1 <= wake_ups < threads * per_thread / 4, wake_ups  # coalesced: far fewer wake-ups than reports
