"""LiveKit Agents' own OpenAI realtime client (`livekit-plugins-openai`, unmodified) shows the live tiny server a
video frame (`push_video`, what an agent does with a participant's camera) and gets a reply whose prompt held it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from livekit import rtc
from livekit.agents import llm
from livekit.agents.metrics import RealtimeModelMetrics
from livekit.plugins.openai.realtime import RealtimeSession

from tests.integration.test_livekit_agents import heard
from tests.integration.test_livekit_long_call import realtime  # noqa: F401 (the fixture: LiveKit's defaults)

pytestmark = pytest.mark.asyncio(loop_scope="session")


def camera_frame(width: int = 320, height: int = 240) -> rtc.VideoFrame:
    """A camera's RGBA frame: a gradient with a bright square in it."""
    rgba = np.zeros((height, width, 4), np.uint8)
    rgba[..., 0] = np.linspace(0, 255, width, dtype=np.uint8)[None, :]
    rgba[..., 1] = np.linspace(0, 255, height, dtype=np.uint8)[:, None]
    rgba[80:160, 120:200, :3] = 255
    rgba[..., 3] = 255
    return rtc.VideoFrame(width, height, rtc.VideoBufferType.RGBA, rgba.tobytes())


async def test_push_video_then_a_reply_that_saw_the_frame(realtime: tuple[RealtimeSession, list]) -> None:  # noqa: F811
    session, errors = realtime
    usage: asyncio.Queue[RealtimeModelMetrics] = asyncio.Queue()
    # a response's metrics (the connection's own come first, with no request id)
    session.on("metrics_collected",
               lambda m: usage.put_nowait(m) if isinstance(m, RealtimeModelMetrics) and m.request_id else None)

    session.push_video(camera_frame())
    reply: llm.GenerationCreatedEvent = await asyncio.wait_for(
        session.generate_reply(instructions="Say what you see."), 10)
    text, frames = await asyncio.wait_for(heard(reply), 60)
    assert frames > 0 and text
    metrics = await asyncio.wait_for(usage.get(), 10)
    assert metrics.input_token_details.image_tokens > 0, metrics
    # the frame stays in the conversation: the next reply's prompt holds it too
    again = await asyncio.wait_for(session.generate_reply(instructions="And now?"), 10)
    await asyncio.wait_for(heard(again), 60)
    assert (await asyncio.wait_for(usage.get(), 10)).input_token_details.image_tokens > 0
    assert errors == []
