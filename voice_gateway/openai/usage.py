"""A finished reply's token counts as the chat API's `usage` object."""

from __future__ import annotations

from typing import Any

from engine import Finished


def chat_usage(finished: Finished) -> dict[str, Any]:
    t = finished.timings
    return {
        "prompt_tokens": t.prompt_tokens,
        "completion_tokens": t.completion_tokens + t.codec_frames,
        "total_tokens": t.prompt_tokens + t.completion_tokens + t.codec_frames,
        "prompt_tokens_details": {"audio_tokens": t.prompt_audio_tokens, "image_tokens": t.prompt_image_tokens,
                                  "cached_tokens": t.cached_tokens},
        # audio_tokens counts codec frames: 1920 samples (80 ms) of 24 kHz audio each
        "completion_tokens_details": {"text_tokens": t.completion_tokens, "audio_tokens": t.codec_frames},
    }
