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
prompt), ("abort", id), ("stop",). Child -> parent: ("ready", info, prompt builder, profile) or ("failed",
reason) once, then ("events", [...]) batched per loop turn, ("state", stage_load, metrics_text)
every `_STATE_PERIOD_S`, and ("stopped",). A reader thread on each side blocks on the pipe
(without the GIL) and hands everything it finds to its loop in one call. If the child dies, every
open stream ends with `Failed` and new submits are refused; if the parent dies, the child stops.

One server process is one event loop, and a burst of arrivals queues on it. With `EngineHost` the
child also listens on a Unix socket, and several server processes (`serve --http-workers N`) attach
to it the same way: each gets its own connection, its requests' events come back on it, and one
that goes away loses only its own requests.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterable
from multiprocessing.connection import Client, Connection, Listener
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
        except (EOFError, OSError, TypeError):  # TypeError: this side closed it under us (a detach)
            batch.append(None)  # the other side is gone; what came before it still counts
        try:
            loop.call_soon_threadsafe(handle, batch)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            return
        if batch[-1] is None:
            return


Address = tuple[str, bytes]  # a child's listening socket and its auth key


def _spawn(model: str, profile: DeployProfile, cache_dir: Path | None,
           listen: Address | None) -> tuple[multiprocessing.process.BaseProcess, Connection]:
    """Start the engine's child process; returns it and the pipe to it (its owner's end)."""
    ctx = multiprocessing.get_context("spawn")  # a fork would copy the parent's threads and locks
    conn, child_conn = ctx.Pipe()
    process = ctx.Process(target=_child_main, args=(child_conn, model, profile, cache_dir,
                                                    logging.getLogger().level, listen),
                          name="voice-gateway-engine", daemon=True)
    process.start()
    child_conn.close()
    return process, conn


class EngineHost:
    """Owns an engine child that serves several server processes (`serve --http-workers N`).

    The child listens on a Unix socket; each server process attaches an `EngineProcess` to it. The
    owner's pipe carries only the start and the stop: nobody reads it in between.
    """

    def __init__(self, model: str, profile: DeployProfile, cache_dir: Path | None = None) -> None:
        self.model, self.profile, self.cache_dir = model, profile, cache_dir
        self.address: Address = (str(Path(tempfile.mkdtemp(prefix="vg-engine-")) / "engine.sock"), os.urandom(16))
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None

    def start(self) -> None:
        self._process, self._conn = _spawn(self.model, self.profile, self.cache_dir, self.address)
        if not self._conn.poll(_START_TIMEOUT_S):
            raise EngineError(f"the engine process did not start within {_START_TIMEOUT_S} s")
        first = self._conn.recv()
        if first[0] != "ready":
            raise EngineError(f"the engine process failed to start: {first[1]}")
        log.info("engine process %d ready for server processes at %s", self._process.pid, self.address[0])

    def stop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.send(("stop",))
                self._conn.poll(30)
            except OSError:
                pass
        if self._process is not None:
            self._process.join(10)
            if self._process.is_alive():
                self._process.kill()
        shutil.rmtree(Path(self.address[0]).parent, ignore_errors=True)


class EngineProcess:
    """The parent's side: an `Engine` whose orchestrator and stages live in a child process.

    It starts the child itself, or with `attach` joins one an `EngineHost` started: then `stop()`
    only detaches, and the child aborts what this process still had in flight.
    """

    def __init__(self, model: str, profile: DeployProfile | None = None, cache_dir: Path | None = None, *,
                 attach: Address | None = None) -> None:
        self.model, self.profile, self.cache_dir = model, profile, cache_dir
        self.attach = attach
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
        if self.attach is not None:
            address, authkey = self.attach
            conn = await asyncio.to_thread(Client, address, authkey=authkey)
        else:
            self._process, conn = _spawn(self.model, self.profile, self.cache_dir, None)
        self._conn = conn
        if not await asyncio.to_thread(conn.poll, _START_TIMEOUT_S):
            raise EngineError(f"the engine process did not start within {_START_TIMEOUT_S} s")
        first = await asyncio.to_thread(conn.recv)
        if first[0] != "ready":
            raise EngineError(f"the engine process failed to start: {first[1]}")
        self.info, self._prompts, self.profile = first[1], first[2], first[3]
        self._alive = True
        loop = asyncio.get_running_loop()
        self._stopped = loop.create_future()
        threading.Thread(target=_read, args=(conn, loop, self._on_messages), name="engine-pipe", daemon=True).start()
        log.info("engine process %s: %s", "attached" if self.attach else f"{self._process.pid} ready", self.info.model_id)

    async def stop(self) -> None:
        self._stopping = True
        if self.attach is not None:
            if self._conn is not None:
                self._conn.close()  # the child aborts what this process had in flight
            self._end_all("server shutting down")
            return
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


def _child_main(conn: Connection, model: str, profile: DeployProfile, cache_dir: Path | None, log_level: int,
                listen: Address | None) -> None:
    # the parent decides when to stop: Ctrl-C reaches the whole process group
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s [engine]: %(message)s")
    try:
        asyncio.run(_ChildServer(conn, listen).run(model, profile, cache_dir))
    finally:
        conn.close()


class _ChildServer:
    """Runs the in-process engine and answers its owner's pipe; with `listen`, also any number of server
    processes that connect to the socket (the owner then only starts and stops it)."""

    def __init__(self, owner: Connection, listen: Address | None) -> None:
        self.owner = owner
        self.listen = listen
        self.engine: Any = None
        self.clients: list[Connection] = [] if listen else [owner]  # those that submit and hear events
        self.routes: dict[str, Connection] = {}  # request id -> the client that submitted it
        self.outbox: dict[Connection, list[OutputEvent]] = {}
        self.flush_scheduled = False
        self.done: asyncio.Future[None] | None = None
        self.tasks: set[asyncio.Task] = set()
        self.last_state: tuple | None = None

    async def run(self, model: str, profile: DeployProfile, cache_dir: Path | None) -> None:
        import dataclasses

        from prometheus_client import generate_latest

        from engine.factory import create_engine

        loop = asyncio.get_running_loop()
        try:
            self.engine = create_engine(model, dataclasses.replace(profile, engine_process=False), cache_dir)
            await self.engine.start()
        except Exception as e:
            log.exception("engine failed to start")
            self._send(self.owner, ("failed", f"{type(e).__name__}: {e}"))
            return
        self.done = loop.create_future()
        self._send(self.owner, self._ready())
        self._listen(self.owner, loop)
        listener = None
        if self.listen is not None:
            listener = Listener(self.listen[0], authkey=self.listen[1])
            threading.Thread(target=self._accept, args=(listener, loop), name="engine-accept", daemon=True).start()
        while not self.done.done():
            state = (self.engine.stage_load(), generate_latest(self.engine.registry).decode())
            if state != self.last_state:
                for client in list(self.clients):
                    self._send(client, ("state", *state))
                self.last_state = state
            await asyncio.wait([self.done], timeout=_STATE_PERIOD_S)
        if listener is not None:
            listener.close()
        await self.engine.stop()  # ends every open stream with Failed
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=5)
        self._flush()
        self._send(self.owner, ("stopped",))

    def _ready(self) -> tuple:
        return ("ready", self.engine.info, self.engine.prompt_builder, self.engine.profile)

    def _listen(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        threading.Thread(target=_read, args=(conn, loop, functools.partial(self._on_messages, conn)),
                         name="engine-pipe", daemon=True).start()

    def _accept(self, listener: Listener, loop: asyncio.AbstractEventLoop) -> None:
        """Socket -> a new client: it gets the engine's description, then joins at the loop's next turn."""
        while True:
            try:
                conn = listener.accept()
                conn.send(self._ready())
            except (OSError, EOFError, multiprocessing.AuthenticationError):
                if self.done is not None and self.done.done():
                    return  # the listener was closed
                continue
            try:
                loop.call_soon_threadsafe(self._join, conn, loop)
            except RuntimeError:
                return

    def _join(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        self.clients.append(conn)
        if self.last_state is not None:
            self._send(conn, ("state", *self.last_state))
        self._listen(conn, loop)

    def _on_messages(self, conn: Connection, batch: list[Any]) -> None:
        for message in batch:
            if message is None:  # this side of the pipe is gone
                self._leave(conn)
            elif message[0] == "stop":
                self._stop()
            elif message[0] == "submit":
                self.routes[message[1].request_id] = conn
                task = asyncio.ensure_future(self._serve(message[1], message[2]))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            elif message[0] == "abort":
                self.engine.abort(message[1])

    def _leave(self, conn: Connection) -> None:
        """A vanished owner stops the engine; a vanished server process only loses its requests."""
        if conn is self.owner:
            self._stop()
            return
        if conn in self.clients:
            self.clients.remove(conn)
            for rid in [rid for rid, owner in self.routes.items() if owner is conn]:
                self.engine.abort(rid)
            conn.close()

    def _stop(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

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
        conn = self.routes.get(event.request_id)
        if isinstance(event, (Finished, Failed)):
            self.routes.pop(event.request_id, None)
        if conn is None or conn not in self.clients:
            return  # its server process left
        self.outbox.setdefault(conn, []).append(event)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        outbox, self.outbox = self.outbox, {}
        for conn, events in outbox.items():
            self._send(conn, ("events", events))

    def _send(self, conn: Connection, message: tuple) -> None:
        try:
            conn.send(message)
        except OSError:  # that side is gone; its reader thread reports it
            if conn is self.owner:
                self._stop()
