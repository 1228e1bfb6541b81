"""How a ladder row's server runs for its sweeps: started fresh for each one (`run_row`), or started once
and held for the whole run, paused between its sweeps (`HeldServers`).

A fresh server is measured in its first minute, which is not the server users meet after an hour,
and alone on the host. Held servers each start and warm once (a sweep that is not recorded), then take
turns: while one row sweeps, every other row's server is stopped with SIGSTOP, its whole process tree
(an engine child, a local Ray's daemons and replicas), so it takes no CPU from the row measured, and
SIGCONT lets it go on where it stood. The server's own supervisors take such a pause for what it is
(engine/remote/silence.py). Either way a row records the CPU its own tree spent over its sweep.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from bench.config import BenchConfig, BenchError
from bench.procstat import cpu_by_process, process_tree, sample_tree
from bench.server import ServerProcess, ServerStartError
from bench.sweep import BenchResult, measure

log = logging.getLogger(__name__)

SETTLE_S = 1.0  # after SIGCONT: the server's supervisors hear their engines' beats before load comes


@dataclass
class RowOutcome:
    name: str
    what: str
    serve_command: str
    status: str = "failed"  # "ok" once the sweep ran and the server lived through it
    error: str | None = None
    startup_s: float | None = None
    result: BenchResult | None = None
    cpu_s: dict[str, float] | None = None  # the server's process tree over the sweep, by process
    held: bool = False  # swept on a server held for the whole run, not one started for this sweep


@dataclass(frozen=True)
class RowServer:
    """What a row's server is started from: its name, its one-line description and its serve arguments."""

    name: str
    what: str
    serve_args: list[str]
    startup_timeout_s: float


def sweep_on(server: ServerProcess, outcome: RowOutcome, config: BenchConfig, console: Console) -> RowOutcome:
    """Sweep a serving server into `outcome`. Never raises for the row's own failures."""
    try:
        before = sample_tree(server.pid)
        outcome.result = asyncio.run(measure(replace(config, url=server.url, label=outcome.name), console))
        outcome.cpu_s = cpu_by_process(before, sample_tree(server.pid))
        if (rc := server.exited()) is not None:
            outcome.error = f"server exited with code {rc} during the sweep; log tail:\n{server.log_tail()}"
        else:
            outcome.status = "ok"
    except BenchError as exc:
        outcome.error = str(exc)
    except Exception as exc:  # a row's bug must not end the ladder: record it and go on
        log.exception("row %s failed", outcome.name)
        outcome.error = f"{type(exc).__name__}: {exc}"
    return outcome


def _server(row: RowServer, log_dir: Path) -> tuple[ServerProcess, RowOutcome]:
    server = ServerProcess(row.serve_args, log_dir / f"{row.name}.log")
    return server, RowOutcome(row.name, row.what, server.command)


def _start(server: ServerProcess, outcome: RowOutcome, row: RowServer, console: Console) -> None:
    """Start the server and wait for /health; ServerStartError (its log tail) if it never serves."""
    with console.status(f"[bold]{row.name}[/]: starting {escape(server.command)}"):
        outcome.startup_s = server.start(row.startup_timeout_s)
    console.print(f"  server up in {outcome.startup_s:.1f} s on {server.url}")


def run_row(row: RowServer, config: BenchConfig, out_dir: Path, console: Console) -> RowOutcome:
    """Start the row's server, sweep it, stop it. Never raises for the row's own failures."""
    server, outcome = _server(row, out_dir / "logs")
    try:
        _start(server, outcome, row, console)
        return sweep_on(server, outcome, config, console)
    except ServerStartError as exc:
        outcome.error = str(exc)
        return outcome
    finally:
        server.stop()


class HeldServers:
    """Owns every row's server for the whole run, each paused except while its own sweeps run."""

    def __init__(self, rows: list[RowServer], out_dir: Path, console: Console) -> None:
        self.console = console
        self._log_dir = out_dir / "logs"
        self._servers: dict[str, ServerProcess] = {}
        self._started: dict[str, RowOutcome] = {}  # each serving row's outcome before a sweep
        self._failed: dict[str, RowOutcome] = {}  # rows whose server never served, and why
        self._paused: dict[str, list[int]] = {}  # row -> the pids stopped, to let go in turn
        self._rows = rows

    @contextmanager
    def held(self, warmup: dict[str, BenchConfig]) -> Iterator[HeldServers]:
        """Start each row's server (the others paused meanwhile), sweep it once unrecorded with its row's
        `warmup` config, and pause it; every server stops on the way out."""
        try:
            for row in self._rows:
                server, outcome = _server(row, self._log_dir)
                outcome.held = True
                try:
                    _start(server, outcome, row, self.console)
                except ServerStartError as exc:
                    outcome.error = str(exc)
                    self._failed[row.name] = outcome
                    continue
                self._servers[row.name], self._started[row.name] = server, outcome
                self.console.print(f"  [dim]{row.name}: a warm-up sweep, not recorded[/]")
                warm = sweep_on(server, replace(outcome), warmup[row.name], self.console)
                if warm.status != "ok":
                    outcome.error = f"its warm-up sweep failed: {warm.error}"
                    self._failed[row.name] = outcome
                self._pause(row.name)
            yield self
        finally:
            for name, server in self._servers.items():
                self._resume(name)
                server.stop()

    def run(self, row: RowServer, config: BenchConfig) -> RowOutcome:
        """Let the row's server go on, sweep it, pause it again. Never raises for the row's own failures."""
        if row.name in self._failed:
            return self._failed[row.name]
        server = self._servers[row.name]
        outcome = replace(self._started[row.name])
        self._resume(row.name)
        time.sleep(SETTLE_S)
        try:
            return sweep_on(server, outcome, config, self.console)
        finally:
            self._pause(row.name)

    def _pause(self, name: str) -> None:
        """Stop the server, then its tree until no process is left running in it (one may have just
        started another)."""
        stopped: list[int] = []
        while fresh := [pid for pid in process_tree(self._servers[name].pid) if pid not in stopped]:
            for pid in fresh:  # the server first: its supervisors stop before its engines do
                _signal(pid, signal.SIGSTOP)
            stopped += fresh
        self._paused[name] = stopped

    def _resume(self, name: str) -> None:
        for pid in reversed(self._paused.pop(name, [])):  # the engines first, the server last
            _signal(pid, signal.SIGCONT)


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # it ended meanwhile: the sweep says so
        pass
