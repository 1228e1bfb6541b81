"""A stage whose step never returns: the engine's health says which stage hung (and refuses new requests), and an
engine process falls silent so that its supervisor replaces it. The hang is a step that waits on an event: a kernel
that never finishes cannot be made on demand, and to the stage's loop the two are the same."""

from __future__ import annotations

import asyncio
import threading
import time
from multiprocessing import Pipe
from typing import Any

import pytest
import torch

from engine import UNAVAILABLE, EngineError
from engine.handoff import AdmittedRequest, Inbox, ReportQueue
from engine.metrics import EngineMetrics
from engine.orchestrator import Orchestrator
from engine.remote.messages import STATE_PERIOD_S
from engine.remote.service import CoreService
from engine.stage import Stage


class Hanging(Stage):
    """Takes a step whenever it holds a request; a step waits while `hang` is set."""

    kind = "talker"

    def __init__(self, metrics: EngineMetrics) -> None:
        super().__init__(Inbox(), lambda report: None, metrics, torch.device("cpu"))
        self.held: list[str] = []
        self.hang = threading.Event()
        self.go_on = threading.Event()

    def accept(self, item: Any) -> None:
        self.held.append(item.request_id)

    def release(self, request_id: str) -> None:
        if request_id in self.held:
            self.held.remove(request_id)

    def has_work(self) -> bool:
        return bool(self.held)

    def step(self) -> list[str]:
        if self.hang.is_set():
            self.go_on.wait()
        time.sleep(0.005)
        return list(self.held)

    def num_waiting(self) -> int:
        return 0

    def num_running(self) -> int:
        return len(self.held)


def _request(rid: str) -> AdmittedRequest:
    return AdmittedRequest(rid, [1, 2, 3], [], 0, [], False, "ethan", 4, 0.0, 1.0, 0, None)


async def _wait_for(what: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


@pytest.fixture
async def engine() -> Any:
    metrics = EngineMetrics()
    stage = Hanging(metrics)
    core = Orchestrator(thinker_inbox=stage.inbox, stages={"talker": stage}, reports=ReportQueue(), metrics=metrics,
                        speaks=False, stall_after_s=0.3)
    await core.start()
    try:
        yield core, stage
    finally:
        stage.go_on.set()
        await core.stop()


async def test_a_stage_whose_step_does_not_return_brings_the_engine_down_until_it_does(
        engine: tuple[Orchestrator, Hanging], caplog: pytest.LogCaptureFixture) -> None:
    core, stage = engine
    core.begin(_request("a"), lambda event: None)
    await asyncio.sleep(0.5)  # steps, and idle turns of the loop, keep it well under the limit
    assert stage.stuck_s() < 0.2 and core.health().status == "ok"
    stage.hang.set()
    await _wait_for(lambda: core.health().status == "down")
    health = core.health()
    assert "the talker stage has hung" in health.detail and stage.stuck_s() > 0.3, health
    with pytest.raises(EngineError) as refused:
        core.begin(_request("b"), lambda event: None)
    assert refused.value.code == UNAVAILABLE
    # said once, however often health is asked, with every thread's stack after it
    assert sum("the talker stage has hung" in r.getMessage() for r in caplog.records) == 1
    stage.hang.clear()
    stage.go_on.set()
    await _wait_for(lambda: core.health().status == "ok")


async def test_an_engine_process_whose_stage_hung_stops_telling_its_state(
        engine: tuple[Orchestrator, Hanging]) -> None:
    """Its supervisor hears nothing (engine/remote/client.py counts the silence) and replaces it."""
    core, stage = engine
    server_end, client_end = Pipe()
    service = CoreService(core, None, asyncio.get_running_loop())  # type: ignore[arg-type]
    service.clients[server_end] = 0
    try:
        await _wait_for(client_end.poll)
        core.begin(_request("a"), lambda event: None)
        stage.hang.set()
        await _wait_for(lambda: core.health().status == "down")
        while client_end.poll():
            client_end.recv()
        await asyncio.sleep(4 * STATE_PERIOD_S)
        assert not client_end.poll(), "a hung engine still beats"
        stage.hang.clear()
        stage.go_on.set()
        await _wait_for(client_end.poll)
    finally:
        await service.stop()
