"""The OpenAI-compatible HTTP API: chat completions (JSON and SSE) and the model list, behind the API key."""

from fastapi import APIRouter

from voice_gateway.openai.chat import router as _chat
from voice_gateway.openai.models import router as _models

router = APIRouter()
router.include_router(_models)
router.include_router(_chat)

__all__ = ["router"]
