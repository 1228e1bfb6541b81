"""OpenAI's error object, and the handlers that turn every failure into it with a fitting status."""

from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine import OVERLOADED, UNAVAILABLE
from voice_gateway.text import printable

log = logging.getLogger(__name__)


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.retry_after_s = retry_after_s

    def body(self) -> dict:
        """The error object; its text may quote the request, so what UTF-8 cannot encode is escaped."""
        param = None if self.param is None else printable(self.param)
        return {"error": {"message": printable(self.message), "type": self.type, "param": param, "code": self.code}}


# refusals that are the server's state, not the request's: the client may try again after Retry-After
_SERVER_STATE = {OVERLOADED: 429, UNAVAILABLE: 503}


def engine_error(message: str, code: str | None, retry_after_s: float | None = None, *, status: int = 400) -> APIError:
    """An engine's refusal (400) or failure (500) as OpenAI's error; overloaded 429 and down 503, with Retry-After."""
    if code in _SERVER_STATE:
        return APIError(_SERVER_STATE[code], message, type="server_error", code=code, retry_after_s=retry_after_s)
    if status >= 500:
        return APIError(status, f"generation failed: {message}", type="server_error", code=code)
    return APIError(status, message, code=code)


def retry_after(seconds: float | None) -> dict[str, str] | None:
    """The Retry-After header for a wait, in whole seconds (at least one)."""
    return None if seconds is None else {"Retry-After": str(max(1, math.ceil(seconds)))}


def _response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=retry_after(err.retry_after_s))


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        log.info("%s %s -> %d: %s", request.method, request.url.path, exc.status, printable(exc.message))
        return _response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":  # its loc is a byte offset, not a field
            where = first.get("loc", ("body", "?"))[-1]
            return _response(APIError(400, f"the body is not valid JSON (at byte {where}): {first.get('msg', '')}",
                                      code="invalid_json"))
        # a `$` tag names the union member pydantic chose (schemas.py), not a place in the request
        loc = [str(p) for p in first.get("loc", ()) if p != "body" and not str(p).startswith("$")]
        param = ".".join(loc) or None
        message = f"{param}: {first.get('msg', 'invalid value')}" if param else first.get("msg", "invalid request")
        return _response(APIError(400, message, param=param, code="invalid_value"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _response(APIError(exc.status_code, str(exc.detail), type=kind))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _response(APIError(500, "internal server error", type="server_error"))
