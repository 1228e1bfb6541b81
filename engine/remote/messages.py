"""What crosses between a server process and the engine's process (a child of its own, or a replica actor on Ray):
frozen messages, pickled on a pipe or a socket.

Server -> engine: `Submit` (media sent once: media.py), `Cancel`, `Stop`. Engine -> server: `Ready` or
`StartFailed` once, then `Events` batched per loop turn, every `STATE_PERIOD_S` its `State` when that changed or
else a `Heartbeat` (so a serving engine is never silent for long), `Resend`, and `Stopped`. `Closed` is never
sent: a reader hands it over when the other side is gone."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.api import OutputEvent
from engine.handoff import AdmittedRequest
from engine.profile import DeployProfile

Address = tuple[str, bytes]  # an engine process's listening socket and its auth key
STATE_PERIOD_S = 0.25  # how stale /health's stage load and /metrics' engine families may be


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """What an engine process runs: enough for a server process that attaches to open its own front door."""

    model: str
    profile: DeployProfile
    cache_dir: Path | None


@dataclass(frozen=True, slots=True)
class Submit:
    request: AdmittedRequest
    sent_at: float = 0.0  # time.time() as the server process sent it; 0: not told


@dataclass(frozen=True, slots=True)
class Resend:
    """The engine has not begun this request: send it again, with every clip's features and image's pixels."""

    request_id: str


@dataclass(frozen=True, slots=True)
class Cancel:
    request_id: str


@dataclass(frozen=True, slots=True)
class Stop:
    pass


@dataclass(frozen=True, slots=True)
class Ready:
    spec: EngineSpec


@dataclass(frozen=True, slots=True)
class StartFailed:
    reason: str


@dataclass(frozen=True, slots=True)
class Events:
    events: tuple[OutputEvent, ...]


@dataclass(frozen=True, slots=True)
class State:
    stage_load: dict[str, int]
    metrics_text: str  # the engine's Prometheus families, as text
    open_requests: int = 0  # every connection's: a router weighs the engine's whole load
    received: int = 0  # the submits it has had from the connection told: what it has not seen yet is in flight
    capacity: str = ""  # the core's (EngineHealth.capacity)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Nothing changed, and the engine is still there."""


@dataclass(frozen=True, slots=True)
class Stopped:
    pass


@dataclass(frozen=True, slots=True)
class Closed:
    """The other side of the pipe is gone; what came before it still counts."""

