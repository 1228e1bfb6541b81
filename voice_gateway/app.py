"""The FastAPI app factory; its lifespan owns one Engine."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from engine.api import Engine
from voice_gateway.errors import install_error_handlers
from voice_gateway.openai_chat import router as chat_router


def create_app(engine: Engine) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        try:
            yield
        finally:
            await engine.stop()

    app = FastAPI(title="voice-gateway", lifespan=lifespan)
    app.state.engine = engine
    app.state.started_at = int(time.time())
    install_error_handlers(app)
    app.include_router(chat_router)

    @app.get("/health")
    async def health(request: Request) -> dict:
        info = engine.info
        return {
            "status": "ok",
            "model": info.model_id,
            "random_weights": info.is_random_weights,
            "active_requests": engine.num_active_requests(),
            "stage_load": engine.stage_load(),
        }

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(engine.registry), media_type=CONTENT_TYPE_LATEST)

    return app
