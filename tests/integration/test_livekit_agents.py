"""LiveKit Agents' own OpenAI realtime client (`livekit-plugins-openai`, unmodified) against the live tiny server:
a spoken turn, generate_reply, barge-in, initial context at the root, truncate and delete, with no error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import numpy as np
import pytest
from livekit import rtc
from livekit.agents import llm
from livekit.plugins.openai.realtime import RealtimeModel, RealtimeSession
from openai.types import realtime as oai

from tests.conftest import Server
from tests.integration.test_realtime import RATE, pcm16, silence, speech  # noqa: F401 (the fixture)

# the client's tasks live on the loop its fixture made it on: the tests share that loop
pytestmark = pytest.mark.asyncio(loop_scope="session")
# The silence sent after each utterance: semantic_vad's clock is the audio, so a turn it holds open ends only
# once this much silence has arrived (its longest wait is 4 s at eagerness auto), as a live microphone sends it.
AFTER_SPEECH_S = 4.5

# LiveKit's defaults (semantic_vad, voice "marin") and its RealtimeModel docstring example's settings
SETTINGS = {
    "defaults": {},
    "example": {
        "voice": "alloy",
        "modalities": ["audio"],
        "input_audio_transcription": oai.AudioTranscription(model="gpt-4o-transcribe"),
        "input_audio_noise_reduction": "near_field",
        "turn_detection": oai.realtime_audio_input_turn_detection.SemanticVad(
            type="semantic_vad", create_response=True, eagerness="auto", interrupt_response=True),
    },
}


async def push_speech(session: RealtimeSession, samples: np.ndarray, chunk_s: float = 0.1) -> None:
    step = int(chunk_s * RATE)
    for i in range(0, len(samples), step):
        chunk = pcm16(samples[i : i + step])
        session.push_audio(rtc.AudioFrame(chunk, RATE, 1, len(chunk) // 2))
        await asyncio.sleep(0)


async def heard(generation: llm.GenerationCreatedEvent, stop_after_frames: int | None = None) -> tuple[str, int]:
    """The reply's transcript and its audio frames (or only its first frames, when told to stop there)."""
    text, frames = "", 0
    async for message in generation.message_stream:
        async def read_text(stream: AsyncIterator[str] = message.text_stream) -> None:
            nonlocal text
            async for piece in stream:
                text += piece

        reader = asyncio.create_task(read_text())
        async for _ in message.audio_stream:
            frames += 1
            if stop_after_frames is not None and frames >= stop_after_frames:
                reader.cancel()
                return text, frames
        await reader
    return text, frames


@pytest.fixture
async def realtime(server: Server, request: pytest.FixtureRequest) -> AsyncIterator[tuple[RealtimeSession, list]]:
    errors: list = []
    async with aiohttp.ClientSession() as http:
        model = RealtimeModel(model="tiny", base_url=server.base_url + "/v1", api_key="unused", http_session=http,
                              **SETTINGS[request.param])
        session = model.session()
        session.on("error", errors.append)
        yield session, errors
        await session.aclose()
        await model.aclose()


@pytest.mark.parametrize("realtime", list(SETTINGS), indirect=True)
async def test_a_livekit_realtime_session(realtime: tuple[RealtimeSession, list], speech: np.ndarray) -> None:  # noqa: F811
    session, errors = realtime
    generations: asyncio.Queue[llm.GenerationCreatedEvent] = asyncio.Queue()
    session.on("generation_created", generations.put_nowait)

    # the initial chat context goes in at the root (previous_item_id "root"), in order
    context = llm.ChatContext.empty()
    context.add_message(role="user", content="Hello, who are you?", id="ctx_user")
    context.add_message(role="assistant", content="A voice assistant.", id="ctx_reply")
    await asyncio.wait_for(session.update_chat_ctx(context), 10)
    assert [item.id for item in session.chat_ctx.items] == ["ctx_user", "ctx_reply"]

    # generate_reply: its response.created must carry the metadata back, or it times out after 10 s
    reply = await asyncio.wait_for(session.generate_reply(instructions="Say hello."), 10)
    text, frames = await asyncio.wait_for(heard(reply), 60)
    assert frames > 0 and text
    await generations.get()  # the same generation, announced too

    # a spoken turn: turn detection (semantic_vad in both settings: Smart Turn) commits it and answers
    await push_speech(session, np.concatenate([silence(0.3), speech, silence(AFTER_SPEECH_S)]))
    spoken = await asyncio.wait_for(generations.get(), 60)
    assert not spoken.user_initiated
    # barge-in: the agent interrupts the reply after its first audio
    await asyncio.wait_for(heard(spoken, stop_after_frames=1), 60)
    session.interrupt()
    await asyncio.sleep(0.5)
    session.interrupt()  # the usual race: the reply is gone already; OpenAI's text keeps this quiet
    await asyncio.sleep(0.5)

    # truncate what was heard of the first reply, then delete the context's first item
    session.truncate(message_id=reply_item(session), modalities=["audio"], audio_end_ms=200)
    trimmed = session.chat_ctx.copy()
    trimmed.items = [item for item in trimmed.items if item.id != "ctx_user"]
    await asyncio.wait_for(session.update_chat_ctx(trimmed), 10)
    assert "ctx_user" not in [item.id for item in session.chat_ctx.items]
    await asyncio.sleep(0.3)
    assert errors == []


def reply_item(session: RealtimeSession) -> str:
    return next(item.id for item in session.chat_ctx.items if item.type == "message" and item.role == "assistant"
                and item.id not in ("ctx_reply",))
