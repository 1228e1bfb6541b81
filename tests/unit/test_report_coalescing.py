"""Stage reports reach the event loop in order, many per wake-up (engine/handoff.py `ReportQueue`)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

from engine.handoff import ReportQueue


@dataclass(frozen=True)
class Report:
    request_id: str
    seq: int


def test_reports_from_many_threads_arrive_in_order_with_few_wake_ups() -> None:
    reports = ReportQueue()
    seen: list[Report] = []
    wake_ups = 0
    drain = reports._drain

    def counted_drain() -> None:
        nonlocal wake_ups
        wake_ups += 1
        drain()

    reports._drain = counted_drain  # type: ignore[method-assign]
    threads, per_thread = 4, 2000

    async def run() -> None:
        reports.bind(asyncio.get_running_loop(), seen.append)

        def stage(name: str) -> None:
            for i in range(per_thread):
                reports.put(Report(name, i))

        workers = [threading.Thread(target=stage, args=(f"s{t}",)) for t in range(threads)]
        for w in workers:
            w.start()
        while any(w.is_alive() for w in workers) or reports._reports or reports._scheduled:
            await asyncio.sleep(0.001)
        for w in workers:
            w.join()

    asyncio.run(run())
    assert len(seen) == threads * per_thread  # nothing lost
    for t in range(threads):
        assert [r.seq for r in seen if r.request_id == f"s{t}"] == list(range(per_thread))  # each thread's order
    assert 1 <= wake_ups < threads * per_thread / 4, wake_ups  # coalesced: far fewer wake-ups than reports
