"""The loop every stage runs in its own thread: drain the inbox, take one step, report.

Requests join and leave between steps; an `Abort` in the inbox frees a request before the next step. A failing
step fails the requests in it, and the loop goes on; a step that never returns (a kernel that hangs, a lock never
given back) shows as the time since the loop last came round (`stuck_s`), which the engine's health reports. On a
GPU each stage queues its kernels on its own CUDA stream, so one stage's host sync never waits for another's queued
work. A GPU tensor handed to the next stage is
complete when sent, or comes with an event recorded after it on the sender's stream (`written`), which the
receiver's stream waits on before reading it; either way the receiver ties its lifetime to its own stream
(`adopt`)."""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import Any

import torch

from engine.handoff import Abort, Inbox, Report, StageFailed
from engine.metrics import EngineMetrics

log = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.05
# Payloads for an aborted request can still be in flight from the stage before this one.
_ABORTED_MEMORY = 4096


class Stage(ABC):
    """Owns the stage's thread and its memory of aborted requests; subclasses own their batches."""

    kind: str  # thinker | talker | code2wav | speak: the default name
    # the CUDA stream's priority (lower runs first; CUDA offers 0 to -3): stages nearer the audio run first.
    # A graph replayed on a stream runs at that stream's priority.
    stream_priority = 0

    def __init__(self, inbox: Inbox, report: Report, metrics: EngineMetrics, device: torch.device,
                 name: str | None = None) -> None:
        self.name = name or self.kind  # a stage's copies are told apart in metrics, logs and thread names
        self.inbox = inbox
        self.report = report
        self.device = device
        self.metrics = metrics
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._aborted: OrderedDict[str, None] = OrderedDict()
        self.last_batch: list[str] = []  # the requests of the step in progress, failed together if it raises
        self.last_phase = "decode"  # what that step was (prefill | decode): a label of its step time
        self._rounded_at = time.monotonic()  # when the loop last came round: every step, or every idle wait

    # -- what a stage implements
    @abstractmethod
    def accept(self, item: Any) -> None: ...

    @abstractmethod
    def release(self, request_id: str) -> None:
        """Forget a request and free what it holds; no-op when unknown."""

    @abstractmethod
    def has_work(self) -> bool: ...

    @abstractmethod
    def step(self) -> list[str]:
        """One forward; returns the request ids in it (failed together if it raises)."""

    @abstractmethod
    def num_waiting(self) -> int: ...

    @abstractmethod
    def num_running(self) -> int: ...

    # -- the loop
    def start(self) -> None:
        self._rounded_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"stage-{self.name}", daemon=True)
        self._thread.start()

    def stuck_s(self) -> float:
        """How long the loop has been inside one turn (a step, or taking payloads): tens of ms when it serves."""
        return time.monotonic() - self._rounded_at

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        cuda = self.device.type == "cuda"
        stream = torch.cuda.Stream(self.device, priority=self.stream_priority) if cuda else None
        with torch.inference_mode(), torch.cuda.stream(stream):
            while not self._stop.is_set():
                for item in self.inbox.drain(block_s=None if self.has_work() else _IDLE_WAIT_S):
                    if isinstance(item, Abort):
                        self._forget(item.request_id)
                    # a payload about many requests (no `request_id`) is never an aborted one's
                    elif getattr(item, "request_id", None) not in self._aborted:
                        self._accept_safely(item)
                if self.has_work():
                    self._step_safely()
                self.metrics.queue_depth.labels(self.name).set(self.num_waiting())
                self.metrics.running.labels(self.name).set(self.num_running())
                self._rounded_at = time.monotonic()

    @staticmethod
    def adopt(tensor: torch.Tensor, written: torch.cuda.Event | None = None) -> torch.Tensor:
        """Keep a tensor made on another stage's stream alive until this stage's queued reads of it finish; with
        `written`, this stage's stream first waits until the sender's has written it (a tensor on the host too: the
        sender's copy into it may still be queued)."""
        if written is not None:
            torch.cuda.current_stream(tensor.device if tensor.is_cuda else None).wait_event(written)
        if tensor.is_cuda:
            tensor.record_stream(torch.cuda.current_stream(tensor.device))
        return tensor

    def written(self) -> torch.cuda.Event | None:
        """On a GPU, an event recorded now on this stage's stream: what it queued so far is written once it passes."""
        if self.device.type != "cuda":
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    def _accept_safely(self, item: Any) -> None:
        try:
            self.accept(item)
        except Exception as e:
            log.exception("%s could not take a payload of %s", self.name, item.request_id)
            self._forget(item.request_id)
            self.report(StageFailed(item.request_id, f"{self.name} failed: {type(e).__name__}: {e}"))

    def _forget(self, request_id: str) -> None:
        self.release(request_id)
        self._aborted[request_id] = None
        if len(self._aborted) > _ABORTED_MEMORY:
            self._aborted.popitem(last=False)

    def _step_safely(self) -> None:
        batch: list[str] = []
        started = time.perf_counter()
        try:
            batch = self.step()
            if batch:
                self.metrics.batch_size.labels(self.name).observe(len(batch))
                self.metrics.step_seconds.labels(self.name, self.last_phase).observe(time.perf_counter() - started)
        except Exception as e:  # a bad batch must not take the stage down
            log.exception("%s step failed", self.name)
            self.fail(batch or self._current_batch(), e)

    def fail(self, request_ids: list[str], error: Exception) -> None:
        for request_id in request_ids:
            self._forget(request_id)
            self.report(StageFailed(request_id, f"{self.name} failed: {type(error).__name__}: {error}"))

    def _current_batch(self) -> list[str]:
        return list(self.last_batch)
