"""GET /v1/models: the one model this server serves, in OpenAI's list shape, with what our clients want to know."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

router = APIRouter()


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    info = request.app.state.engine.info
    return {
        "object": "list",
        "data": [
            {
                "id": info.model_id,
                "object": "model",
                "created": request.app.state.started_at,
                "owned_by": "voice-gateway",
                "description": info.description,
                "random_weights": info.is_random_weights,
                "max_model_len": info.max_model_len,
                "voices": list(info.speakers),
                # what input the model takes besides text: speech always; images where it has a vision tower
                "input_modalities": ["text", "audio", *(["image"] if info.max_image_pixels else [])],
                # it makes speech text before it thinks: a transcription of the user's turns costs nothing more, and
                # its realtime sessions take turns by what was said (semantic_vad with the words of each pause)
                "listens_ahead": info.listens_ahead,
            }
        ],
    }
