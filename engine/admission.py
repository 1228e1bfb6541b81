"""What every engine backend does at the door: check a request, bound its reply, and hand back
the stream of its events (closing the stream early aborts the request)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from engine.api import EngineError, EngineRequest, Failed, Finished, OutputEvent
from engine.profile import DeployProfile, ThinkerConfig


def resolve_speaker(request: EngineRequest, profile: DeployProfile, speakers: tuple[str, ...]) -> str:
    """The voice a request speaks in; an error when it wants audio this model cannot give."""
    speaker = (request.speaker or profile.stages.talker.default_speaker).lower()
    if request.want_audio:
        if not speakers:
            raise EngineError("this model has no talker: ask for text only")
        if speaker not in speakers:
            raise EngineError(f"unknown voice {request.speaker!r}; available: {', '.join(speakers)}")
    return speaker


def resolve_max_tokens(requested: int | None, cfg: ThinkerConfig, prompt_len: int) -> int:
    """The profile's default clipped to the context; an explicit limit that does not fit is an error."""
    if requested is not None and requested < 1:
        raise EngineError("max_tokens must be at least 1")
    if prompt_len + 1 > cfg.max_model_len:
        raise EngineError(
            f"the prompt is {prompt_len} tokens; this model's context is {cfg.max_model_len} tokens",
            code="context_length_exceeded",
        )
    if requested is None:
        return min(cfg.default_max_tokens, cfg.max_model_len - prompt_len)
    if prompt_len + requested > cfg.max_model_len:
        raise EngineError(
            f"the prompt ({prompt_len} tokens) plus max_tokens ({requested}) exceeds this model's "
            f"context of {cfg.max_model_len} tokens",
            code="context_length_exceeded",
        )
    return requested


class RequestStream:
    """Async iterator over one request's events, up to its Finished or Failed."""

    def __init__(self, request_id: str, events: asyncio.Queue[OutputEvent], abort: Callable[[str], None]) -> None:
        self.request_id = request_id
        self._events = events
        self._abort = abort
        self._ended = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> OutputEvent:
        if self._ended:
            raise StopAsyncIteration
        event = await self._events.get()
        self._ended = isinstance(event, (Finished, Failed))
        return event

    async def aclose(self) -> None:
        if not self._ended:
            self._ended = True
            self._abort(self.request_id)
