"""The edge's front door: the API key, the model name, and the concurrent-session count, checked in one place.

Every route asks `Admission` the same three questions; each transport only says no in its own way (an HTTP
error object, or a WebSocket error event and close code). A session holds a `SessionSlot` from the moment it
is let in; the slot gives its place back exactly once, however the session ends (or fails to start).
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import Request

from engine import Engine
from voice_gateway.config import GatewayConfig
from voice_gateway.errors import APIError
from voice_gateway.metrics import GatewayMetrics

# Browsers cannot set headers on a WebSocket: OpenAI's clients put the key in a subprotocol instead.
SUBPROTOCOL_KEY_PREFIX = "openai-insecure-api-key."


def offered_api_key(authorization: str | None, subprotocols: Sequence[str] = ()) -> str | None:
    """The key from `Authorization: Bearer <key>`, else from an `openai-insecure-api-key.<key>` subprotocol."""
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    for proto in subprotocols:
        if proto.startswith(SUBPROTOCOL_KEY_PREFIX):
            return proto[len(SUBPROTOCOL_KEY_PREFIX):]
    return None


# the `reason` label of gateway_refused_sessions, as it was before admission had one place
_REFUSAL_REASONS = {"invalid_api_key": "unauthorized"}


class Refused(Exception):
    """A connection the server will not take; `code` is OpenAI's error code, `status` the HTTP status."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param

    def as_api_error(self) -> APIError:
        return APIError(self.status, self.message, param=self.param, code=self.code)


class SessionSlot:
    """One admitted session's place in the count; `release` gives it back once, later calls do nothing."""

    def __init__(self, admission: Admission, transport: str) -> None:
        self._admission = admission
        self.transport = transport
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._admission._release(self)


class Admission:
    """Owns the count of open realtime sessions; checks keys and model names against this server's settings."""

    def __init__(self, gateway: GatewayConfig, engine: Engine, metrics: GatewayMetrics) -> None:
        self.api_key = gateway.api_key
        self.max_sessions = gateway.max_sessions
        self._engine = engine  # its model id is known once it has started, so it is read per check
        self._metrics = metrics
        self._active = 0

    @property
    def active_sessions(self) -> int:
        return self._active

    def check_key(self, authorization: str | None, subprotocols: Sequence[str] = ()) -> None:
        if self.api_key is not None and offered_api_key(authorization, subprotocols) != self.api_key:
            raise Refused(401, "invalid_api_key", "Incorrect or missing API key.")

    def check_model(self, model: str | None) -> None:
        """`model` names the model this server serves; None (a realtime URL without `?model=`) takes it."""
        served = self._engine.info.model_id
        if model is not None and model != served:
            raise Refused(404, "model_not_found", f"The model `{model}` does not exist; this server serves `{served}`.",
                          param="model")

    def admit(self, transport: str, authorization: str | None, subprotocols: Sequence[str], model: str | None
              ) -> SessionSlot:
        """Key, then model, then a free place: the slot of a new realtime session, or Refused (counted by code)."""
        try:
            self.check_key(authorization, subprotocols)
            self.check_model(model)
            return self.acquire(transport)
        except Refused as refused:
            self._metrics.refused_sessions.labels(_REFUSAL_REASONS.get(refused.code, refused.code)).inc()
            raise

    def acquire(self, transport: str) -> SessionSlot:
        """A place for one more session, counted from now: before any await that could let another one in."""
        if self._active >= self.max_sessions:
            raise Refused(503, "too_many_sessions", f"the server is at its limit of {self.max_sessions} sessions")
        self._active += 1
        self._metrics.active_sessions.labels(transport).inc()
        return SessionSlot(self, transport)

    def _release(self, slot: SessionSlot) -> None:
        assert self._active > 0, f"released a slot with {self._active} sessions counted"
        self._active -= 1
        self._metrics.active_sessions.labels(slot.transport).dec()


def admission_of(request: Request) -> Admission:
    return request.app.state.admission


async def require_api_key(request: Request) -> None:
    """FastAPI dependency for the HTTP API routes."""
    try:
        admission_of(request).check_key(request.headers.get("authorization"))
    except Refused as refused:
        raise refused.as_api_error() from None
