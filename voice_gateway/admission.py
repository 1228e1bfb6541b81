"""The edge's front door: the caller's origin and host, the API key, the model name, and the concurrent-session
count, checked in one place; each transport only says no in its own way. A session holds a `SessionSlot` from
the moment it is let in, which gives its place back exactly once, however the session ends."""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from fastapi import Request
from starlette.requests import HTTPConnection

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


@dataclass(frozen=True, slots=True)
class Caller:
    """What one connection says about itself: the scheme it came on and its Host, Origin and key headers."""

    scheme: str  # http, https, ws or wss
    host: str | None
    origin: str | None
    authorization: str | None
    subprotocols: tuple[str, ...] = ()

    @classmethod
    def of(cls, conn: HTTPConnection) -> Caller:
        headers = conn.headers
        return cls(conn.url.scheme, headers.get("host"), headers.get("origin"), headers.get("authorization"),
                   tuple(conn.scope.get("subprotocols", ())))

    @property
    def own_origin(self) -> str:
        """The origin of a page served from the host this connection reached: a same-origin page sends this."""
        return f"{'https' if self.scheme in ('https', 'wss') else 'http'}://{(self.host or '').lower()}"


def host_name(host: str) -> str:
    """A Host header's name, lowercase and without its port: 'Example:8000' -> 'example', '[::1]:80' -> '::1'."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_loopback(name: str) -> bool:
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


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
        self.allowed_origins = frozenset(o.lower().rstrip("/") for o in gateway.allowed_origins)
        self.allowed_hosts = frozenset(host_name(h) if h != "*" else h for h in gateway.allowed_hosts)
        self.max_sessions = gateway.max_sessions
        self._engine = engine  # its model id is known once it has started, so it is read per check
        self._metrics = metrics
        self._active = 0

    @property
    def active_sessions(self) -> int:
        return self._active

    def check_origin(self, caller: Caller) -> None:
        """A web page may drive a session only from this server's own origin or one named in `allowed_origins`,
        and only through a Host that is loopback or named in `allowed_hosts` (so a DNS-rebound name is refused).
        A client without an Origin is no browser page: the openai SDK sends none."""
        if caller.host is None or not self._host_allowed(host_name(caller.host)):
            raise Refused(403, "origin_not_allowed", f"the Host {caller.host!r} is not allowed on this server "
                          "(--allowed-hosts)")
        if caller.origin is None:
            return
        origin = caller.origin.lower().rstrip("/")
        if origin != caller.own_origin and origin not in self.allowed_origins and "*" not in self.allowed_origins:
            raise Refused(403, "origin_not_allowed", f"the Origin {caller.origin!r} is not allowed on this server "
                          "(--allowed-origins)")

    def _host_allowed(self, name: str) -> bool:
        return is_loopback(name) or name in self.allowed_hosts or "*" in self.allowed_hosts

    def check_key(self, authorization: str | None, subprotocols: Sequence[str] = ()) -> None:
        if self.api_key is None:
            return
        offered = offered_api_key(authorization, subprotocols)
        # constant time: how long a wrong key takes to refuse says nothing about how much of it was right
        if offered is None or not hmac.compare_digest(offered.encode(), self.api_key.encode()):
            raise Refused(401, "invalid_api_key", "Incorrect or missing API key.")

    def check_model(self, model: str | None) -> None:
        """`model` names the model this server serves; None (a realtime URL without `?model=`) takes it."""
        served = self._engine.info.model_id
        if model is not None and model != served:
            raise Refused(404, "model_not_found", f"The model `{model}` does not exist; this server serves `{served}`.",
                          param="model")

    def admit(self, transport: str, caller: Caller, model: str | None) -> SessionSlot:
        """Origin and host, key, model, then a free place: a new realtime session's slot, or Refused (counted)."""
        try:
            self.check_origin(caller)
            self.check_key(caller.authorization, caller.subprotocols)
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
    try:
        admission_of(request).check_key(request.headers.get("authorization"))
    except Refused as refused:
        raise refused.as_api_error() from None
