"""The FastAPI app factory; its lifespan owns one Engine."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import anyio
import torch
from fastapi import Depends, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ConfigDict, TypeAdapter
from starlette.types import ASGIApp, Receive, Scope, Send

from engine import Engine
from engine.deploy import EngineAt, RayAddress, attach_engine, attach_replicas, freeze_startup_heap, thaw_heap
from voice_gateway.admission import Admission, require_api_key
from voice_gateway.body_limit import LimitBody
from voice_gateway.config import GatewayConfig
from voice_gateway.errors import install_error_handlers, retry_after
from voice_gateway.metrics import GatewayMetrics, shared_across_processes
from voice_gateway.openai import router as openai_router
from voice_gateway.phone import CallBook, PhoneConfig, attach_sideband, control_router, incoming_router, media_router
from voice_gateway.phone.peers import Peers
from voice_gateway.realtime.ws import router as realtime_router
from voice_gateway.webrtc import WebRTCConfig
from voice_gateway.webrtc import router as webrtc_router

WEB_DIR = Path(__file__).resolve().parent.parent / "web"


class StampArrival:
    """ASGI middleware: `request.state.received_at` stamped before the body is read, where latency starts."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})["received_at"] = time.perf_counter()
        await self.app(scope, receive, send)


WORKER_ENV = "VOICE_GATEWAY_WORKER"  # `serve --http-workers N` -> each worker: its `WorkerSpec`, as JSON


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What each of `serve --http-workers N`'s server processes is told by the CLI that starts them: where its
    engine is, and its settings. It travels in one environment variable (uvicorn's workers are spawned, and
    built by `worker_app`), as JSON that is validated again on the way in."""

    __pydantic_config__ = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")  # the engine's auth key

    engine_at: EngineAt
    log_level: str
    metrics_dir: Path  # the workers' gateway figures, which each worker's /metrics sums (voice_gateway/metrics.py)
    gateway: GatewayConfig
    webrtc: WebRTCConfig
    phone: PhoneConfig
    phone_dir: Path  # the calls the workers share (voice_gateway/phone/peers.py)

    def publish(self) -> None:
        os.environ[WORKER_ENV] = _WORKER_SPEC.dump_json(self).decode()

    @classmethod
    def read(cls) -> WorkerSpec:
        return _WORKER_SPEC.validate_json(os.environ[WORKER_ENV])


_WORKER_SPEC = TypeAdapter(WorkerSpec)


def worker_app() -> FastAPI:
    """One of `serve --http-workers N`'s server processes: the app on the engine its parent started."""
    spec = WorkerSpec.read()
    metrics = shared_across_processes(spec.metrics_dir)  # before this process makes any other metric
    # a spawned worker starts with the root logger unset; ours are the CLI's, tagged with the process
    logging.basicConfig(level=spec.log_level,
                        format=f"%(asctime)s %(levelname)s %(name)s [http {os.getpid()}]: %(message)s")
    # it runs no model: a torch op on a picture would spread over every core, its idle workers spinning beside
    # the engine's threads and the other server processes'
    torch.set_num_threads(1)
    at = spec.engine_at
    engine = attach_replicas(at) if isinstance(at, RayAddress) else attach_engine(at)
    return create_app(engine, spec.gateway, spec.webrtc, metrics, spec.phone, spec.phone_dir)


def _add_docs(app: FastAPI, keyed: list) -> None:
    """/openapi.json, /docs and /redoc behind the API key. The docs pages fetch /openapi.json without it: on a
    keyed server they show only what a client that sends the key reads from /openapi.json itself."""

    @app.get("/openapi.json", include_in_schema=False, dependencies=keyed)
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=keyed)
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - docs")

    @app.get("/redoc", include_in_schema=False, dependencies=keyed)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title=f"{app.title} - ReDoc")


def create_app(engine: Engine, gateway: GatewayConfig | None = None, webrtc: WebRTCConfig | None = None,
               metrics: GatewayMetrics | None = None, phone: PhoneConfig | None = None,
               phone_dir: Path | None = None) -> FastAPI:
    """The server's app on `engine`; `phone_dir` is the folder where several HTTP workers share their calls."""
    gateway = gateway or GatewayConfig()
    phone = phone or PhoneConfig()
    calls = CallBook(phone.token_ttl_s, Peers(phone_dir, phone.token_ttl_s) if phone_dir is not None else None)
    metrics = metrics or GatewayMetrics()
    admission = Admission(gateway, engine, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        # anyio imports its event-loop backend at first use: a streamed response's task group. Here, not in
        # the first request, which it would hold up (each of `--http-workers` processes has its own first)
        async with anyio.create_task_group():
            pass
        freeze_startup_heap()
        try:
            async with calls.peers.serving(app) if calls.peers is not None else nullcontext():
                yield
        finally:
            for call in list(app.state.calls):
                await call.close()
            await engine.stop()
            thaw_heap()

    # the docs are ours to serve: FastAPI's own routes for them take no dependencies, so no key
    app = FastAPI(title="voice-gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine = engine
    app.state.gateway = gateway
    app.state.gateway_metrics = metrics
    app.state.admission = admission
    app.state.webrtc = webrtc or WebRTCConfig()
    app.state.calls = set()
    app.state.phone = phone
    app.state.phone_calls = calls
    app.state.sideband = attach_sideband  # WS /v1/realtime?call_id=...: realtime/ws.py hands the socket over
    app.state.started_at = int(time.time())
    install_error_handlers(app)
    app.add_middleware(LimitBody, max_bytes=gateway.max_body_bytes)
    app.add_middleware(StampArrival)
    keyed = [Depends(require_api_key)]  # with a key set, everything but /health and the demo's files wants it
    app.include_router(openai_router, dependencies=keyed)
    app.include_router(realtime_router)
    app.include_router(webrtc_router)
    # the carrier's webhook and stream: signed or token-gated, never keyed (a carrier sends no API key)
    app.include_router(incoming_router)
    app.include_router(media_router)
    app.include_router(control_router, dependencies=keyed)

    @app.get("/health")
    async def health() -> JSONResponse:
        """Readiness and liveness in one: 200 while the engine serves (`ok`, or `degraded`: its process is
        late to report), 503 with Retry-After while it cannot (`down`: stopped, or its process lost and
        being restarted, when every request gets the same 503)."""
        info, state = engine.info, engine.health()
        body = {
            "status": state.status,
            "model": info.model_id,
            "random_weights": info.is_random_weights,
            "active_requests": engine.num_active_requests(),
            "active_sessions": admission.active_sessions,
            "stage_load": engine.stage_load(),
            "engine": {"detail": state.detail, "restarts": state.restarts},
            "capacity": state.capacity or None,
        }
        if state.status != "down":
            return JSONResponse(body)
        return JSONResponse(body, status_code=503, headers=retry_after(state.retry_after_s))

    @app.get("/metrics", dependencies=[] if gateway.public_metrics else keyed)
    async def prometheus() -> Response:
        # the engine's families once (an engine process's, as its last report gave them), then the gateway's
        text = generate_latest(engine.registry) + metrics.exposition()
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    _add_docs(app, keyed)
    if WEB_DIR.is_dir():
        # last: the demo page owns whatever path no API route took
        app.mount("/", StaticFiles(directory=WEB_DIR, html=True), name="web")
    return app
