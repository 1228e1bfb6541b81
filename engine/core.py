"""What runs admitted requests: a backend's stages behind the gate (engine/backend.py), or a proxy to them in
another process. The front end (engine/frontend.py) drives any of them the same way."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry

from engine.api import EngineHealth, Failed, Finished, OutputEvent
from engine.handoff import AdmittedRequest

# Where one request's events go, on the core's event loop, in order, ending with Finished or Failed.
Sink = Callable[[OutputEvent], None]

SERVING = EngineHealth("ok")  # a core in this process, once started, serves until it is stopped


def deliver(sinks: dict[str, Sink], event: OutputEvent) -> bool:
    """Hand `event` to its request's sink, if it has one, forgetting the sink at the request's end; True
    when the event ended an open request. How a proxy to a core elsewhere routes what comes back."""
    sink = sinks.get(event.request_id)
    if sink is None:
        return False
    ended = isinstance(event, (Finished, Failed))
    if ended:
        del sinks[event.request_id]
    sink(event)
    return ended


@dataclass(frozen=True, slots=True)
class Pools:
    """The KV pools a core's stages reserve each reply's room from when it starts (its prompt and longest reply in
    the Thinker's, and in the Talker's its prompt's rows and `talker_reply_rows`), in pages of `page` positions: what
    the gate counts so that replies past the pools wait or are refused rather than queue inside the stages."""

    thinker_positions: int
    talker_rows: int
    talker_reply_rows: int  # a reply's frames and its assistant header
    page: int
    thinker_max_len: int  # a slot's most, which no reservation passes
    talker_max_len: int

    def room(self, request: AdmittedRequest) -> tuple[int, int]:
        """The Thinker positions and Talker rows `request` reserves, whole pages of each."""
        prompt = len(request.token_ids)
        rows = self._pages(min(prompt + self.talker_reply_rows, self.talker_max_len)) if request.want_audio else 0
        return self._pages(min(prompt + request.max_tokens + 1, self.thinker_max_len)), rows

    def _pages(self, n: int) -> int:
        return -(-n // self.page) * self.page


class EngineCore(Protocol):
    registry: CollectorRegistry

    async def start(self) -> None: ...

    async def stop(self) -> None:
        """Every request still open ends with Failed."""
        ...

    def begin(self, request: AdmittedRequest, sink: Sink) -> None:
        """Start an admitted request; raises EngineError when it cannot be taken."""
        ...

    def abort(self, request_id: str) -> None:
        """Remove a request from every stage within one step; its sink gets Failed("aborted"). Safe twice."""
        ...

    def stage_load(self) -> dict[str, int]:
        ...

    def health(self) -> EngineHealth:
        """Whether it serves, once started and until stopped (the front end answers for before and after)."""
        ...
