"""The engine in a process of its own, behind the same `Engine` interface (`engine_process: true`).

In one process the server's event loop shares Python's GIL with the three stage threads: every time
the loop gives the GIL up (each socket read and write, each wait for events) it waits to get it back
while a stage thread runs Python, up to the 5 ms switch interval a time. At c=64 that put tens of
milliseconds between a request's arrival and its `submit`, and between an audio chunk and its bytes
(benchmarks/h200/NOTES.md, sessions 8-9). Here the orchestrator and its stages run in a child process
with their own GIL; the server's process keeps only HTTP, JSON and base64.

The parent also admits each request (its voice, its prompt's tokens and audio features, its length)
before it sends it: on the child's side that work would wait on the stage threads for the GIL just
the same, and a response then starts without waiting for the child.

Parent and child talk over one duplex pipe of pickled tuples. Parent -> child: ("submit", request,
prompt), ("abort", id), ("stop",). Child -> parent: ("ready", info, prompt builder) or ("failed",
reason) once, then ("events", [...]) batched per loop turn, ("state", stage_load, metrics_text)
every `_STATE_PERIOD_S`, and ("stopped",). A reader thread on each side blocks on the pipe
(without the GIL) and hands everything it finds to its loop in one call. If the child dies, every
open stream ends with `Failed` and new submits are refused; if the parent dies, the child stops.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import signal
import threading
from collections.abc import Iterable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from engine.admission import RequestStream, resolve_max_tokens, resolve_speaker
from engine.api import AudioPart, EngineError, EngineRequest, Failed, Finished, ModelInfo, OutputEvent
from engine.profile import DeployProfile
from engine.prompt import Prompt, PromptBuilder

log = logging.getLogger(__name__)

_STATE_PERIOD_S = 0.25  # how stale /health's stage load and /metrics' engine families may be
_START_TIMEOUT_S = 1800  # a full-size model with its graphs and compiles takes minutes


class _PushedMetrics(Collector):
    """The child's engine metrics as last pushed, re-exposed from the parent's registry."""

    def __init__(self) -> None:
        self.text = ""

    def collect(self) -> Iterable[Any]:
        return text_string_to_metric_families(self.text) if self.text else ()


def _read(conn: Connection, loop: asyncio.AbstractEventLoop, handle: Any) -> None:
    """Pipe -> loop: block for one message, take whatever else is waiting, hand them over in one call."""
    while True:
        batch: list[Any] = []
        try:
            batch.append(conn.recv())
            while conn.poll():
                batch.append(conn.recv())
        except (EOFError, OSError):
            batch.append(None)  # the other side is gone; what came before it still counts
        try:
            loop.call_soon_threadsafe(handle, batch)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            return
        if batch[-1] is None:
            return


class EngineProcess:
    """The parent's side: an `Engine` whose orchestrator and stages live in a child process."""

    def __init__(self, model: str, profile: DeployProfile, cache_dir: Path | None = None) -> None:
        self.model, self.profile, self.cache_dir = model, profile, cache_dir
        self.info: ModelInfo | None = None  # set by start()
        self._pushed = _PushedMetrics()
        self.registry = CollectorRegistry()
        self.registry.register(self._pushed)
        self._prompts: PromptBuilder | None = None  # the child's, set by start()
        self._stage_load: dict[str, int] = {}
        self._queues: dict[str, asyncio.Queue[OutputEvent]] = {}
        self._conn: Connection | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        self._alive = False
        self._stopping = False
        self._stopped: asyncio.Future[None] | None = None

    async def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # a fork would copy the parent's threads and locks
        conn, child_conn = ctx.Pipe()
        self._process = ctx.Process(target=_child_main, args=(child_conn, self.model, self.profile, self.cache_dir,
                                                               logging.getLogger().level),
                                    name="voice-gateway-engine", daemon=True)
        self._process.start()
        child_conn.close()
        self._conn = conn
        if not await asyncio.to_thread(conn.poll, _START_TIMEOUT_S):
            raise EngineError(f"the engine process did not start within {_START_TIMEOUT_S} s")
        first = await asyncio.to_thread(conn.recv)
        if first[0] != "ready":
            raise EngineError(f"the engine process failed to start: {first[1]}")
        self.info, self._prompts = first[1], first[2]
        self._alive = True
        loop = asyncio.get_running_loop()
        self._stopped = loop.create_future()
        threading.Thread(target=_read, args=(conn, loop, self._on_messages), name="engine-pipe", daemon=True).start()
        log.info("engine process %d ready: %s", self._process.pid, self.info.model_id)

    async def stop(self) -> None:
        self._stopping = True
        if self._alive and self._stopped is not None:
            self._send(("stop",))
            try:
                await asyncio.wait_for(asyncio.shield(self._stopped), timeout=30)
            except TimeoutError:
                log.error("engine process did not stop within 30 s")
        if self._process is not None:
            await asyncio.to_thread(self._process.join, 10)
            if self._process.is_alive():
                self._process.kill()
        self._end_all("server shutting down")

    async def submit(self, request: EngineRequest) -> RequestStream:
        rid = request.request_id
        if not self._alive:
            raise EngineError("the engine process is not running")
        if rid in self._queues:
            raise EngineError(f"request id {rid} is already in use")
        assert self._prompts is not None and self.info is not None
        # the engine's own admission, here: a refusal is an error now, and an accepted request waits for
        # no answer from the child before its response starts
        resolve_speaker(request, self.profile, self.info.speakers)
        if _has_audio(request):  # audio features take a while; text tokenizes in a fraction of a millisecond
            prompt = await asyncio.to_thread(self._prompts.build, request.messages)
        else:
            prompt = self._prompts.build(request.messages)
        resolve_max_tokens(request.sampling.max_tokens, self.profile.stages.thinker, len(prompt.token_ids))
        if not self._alive or rid in self._queues:  # checked again: the build may have awaited
            raise EngineError("the engine process is not running" if not self._alive else f"request id {rid} is already in use")
        self._queues[rid] = asyncio.Queue()
        self._send(("submit", request, prompt))
        return RequestStream(rid, self._queues[rid], self.abort)

    def abort(self, request_id: str) -> None:
        if self._alive and request_id in self._queues:
            self._send(("abort", request_id))  # the child answers with the request's Failed("aborted")

    def num_active_requests(self) -> int:
        return len(self._queues)

    def stage_load(self) -> dict[str, int]:
        return dict(self._stage_load)

    # -- the pipe
    def _send(self, message: tuple) -> None:
        assert self._conn is not None
        try:
            self._conn.send(message)
        except OSError:  # the child is gone; the reader thread's EOF ends every stream
            log.error("engine process pipe is closed")

    def _on_messages(self, batch: list[Any]) -> None:
        for message in batch:
            if message is None:
                self._lost()
                continue
            kind = message[0]
            if kind == "events":
                for event in message[1]:
                    self._deliver(event)
            elif kind == "state":
                self._stage_load, self._pushed.text = message[1], message[2]
            elif kind == "stopped" and self._stopped is not None and not self._stopped.done():
                self._stopped.set_result(None)

    def _deliver(self, event: OutputEvent) -> None:
        queue = self._queues.get(event.request_id)
        if queue is None:
            return
        queue.put_nowait(event)
        if isinstance(event, (Finished, Failed)):
            del self._queues[event.request_id]

    def _lost(self) -> None:
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)
        if self._alive and not self._stopping:
            log.error("engine process exited")
            self._end_all("the engine process exited")

    def _end_all(self, reason: str) -> None:
        self._alive = False
        for rid, queue in list(self._queues.items()):
            queue.put_nowait(Failed(rid, reason))
        self._queues.clear()


def _has_audio(request: EngineRequest) -> bool:
    return any(isinstance(part, AudioPart) for message in request.messages for part in message.content)


# -- the child's side


def _child_main(conn: Connection, model: str, profile: DeployProfile, cache_dir: Path | None, log_level: int) -> None:
    # the parent decides when to stop: Ctrl-C reaches the whole process group
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s [engine]: %(message)s")
    try:
        asyncio.run(_ChildServer(conn).run(model, profile, cache_dir))
    finally:
        conn.close()


class _ChildServer:
    """Runs the in-process engine and answers the parent's pipe."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.engine: Any = None
        self.outbox: list[OutputEvent] = []
        self.flush_scheduled = False
        self.done: asyncio.Future[None] | None = None
        self.tasks: set[asyncio.Task] = set()

    async def run(self, model: str, profile: DeployProfile, cache_dir: Path | None) -> None:
        import dataclasses

        from prometheus_client import generate_latest

        from engine.api import create_engine

        loop = asyncio.get_running_loop()
        try:
            self.engine = create_engine(model, dataclasses.replace(profile, engine_process=False), cache_dir)
            await self.engine.start()
        except Exception as e:
            log.exception("engine failed to start")
            self._send(("failed", f"{type(e).__name__}: {e}"))
            return
        self.done = loop.create_future()
        self._send(("ready", self.engine.info, self.engine.prompt_builder))
        threading.Thread(target=_read, args=(self.conn, loop, self._on_messages), name="engine-pipe",
                         daemon=True).start()
        last_state = None
        while not self.done.done():
            state = (self.engine.stage_load(), generate_latest(self.engine.registry).decode())
            if state != last_state:
                self._send(("state", *state))
                last_state = state
            await asyncio.wait([self.done], timeout=_STATE_PERIOD_S)
        await self.engine.stop()  # ends every open stream with Failed
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=5)
        self._flush()
        self._send(("stopped",))

    def _on_messages(self, batch: list[Any]) -> None:
        for message in batch:
            if message is None or message[0] == "stop":  # a vanished parent stops the engine too
                if self.done is not None and not self.done.done():
                    self.done.set_result(None)
            elif message[0] == "submit":
                task = asyncio.ensure_future(self._serve(message[1], message[2]))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            elif message[0] == "abort":
                self.engine.abort(message[1])

    async def _serve(self, request: EngineRequest, prompt: Prompt) -> None:
        rid = request.request_id
        try:
            stream = await self.engine.submit(request, prompt)
        except Exception as e:  # noqa: BLE001 - the parent admitted it already: its stream must still end
            log.exception("request %s: the engine refused what the server admitted", rid)
            self._queue(Failed(rid, str(e) if isinstance(e, EngineError) else f"internal error: {type(e).__name__}: {e}"))
            return
        async for event in stream:
            self._queue(event)

    def _queue(self, event: OutputEvent) -> None:
        self.outbox.append(event)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        if self.outbox:
            events, self.outbox = self.outbox, []
            self._send(("events", events))

    def _send(self, message: tuple) -> None:
        try:
            self.conn.send(message)
        except OSError:  # the parent is gone: stop serving
            if self.done is not None and not self.done.done():
                self.done.set_result(None)
