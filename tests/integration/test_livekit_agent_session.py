"""A full LiveKit `AgentSession` (livekit-agents, unmodified) with this server as its realtime model, against the
live tiny server: a microphone and a speaker of our own stand in for a room. generate_reply, a spoken turn, the
session's history, with no error and no timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import numpy as np
import pytest
from livekit import rtc
from livekit.agents import Agent, AgentSession, llm
from livekit.agents.voice.events import ConversationItemAddedEvent, ErrorEvent
from livekit.agents.voice.io import AudioInput, AudioOutput, AudioOutputCapabilities
from livekit.plugins.openai.realtime import RealtimeModel

from tests.conftest import Server
from tests.integration.test_realtime import RATE, pcm16, silence, speech  # noqa: F401 (the fixture)

pytestmark = pytest.mark.asyncio(loop_scope="session")
# The silence sent after each utterance: semantic_vad's clock is the audio, so a turn it holds open ends only
# once this much silence has arrived (its longest wait is 4 s at eagerness auto), as a live microphone sends it.
AFTER_SPEECH_S = 4.5

_FRAME_S = 0.02  # a room delivers 10-20 ms frames


class Microphone(AudioInput):
    """The session's audio input: frames put here come out in order; silence between what is spoken."""

    def __init__(self) -> None:
        super().__init__(label="test microphone")
        self._frames: asyncio.Queue[rtc.AudioFrame] = asyncio.Queue()

    async def __anext__(self) -> rtc.AudioFrame:
        return await self._frames.get()

    def speak(self, samples_24k: np.ndarray) -> None:
        step = int(_FRAME_S * RATE)
        for i in range(0, samples_24k.size, step):
            data = pcm16(samples_24k[i : i + step])
            self._frames.put_nowait(rtc.AudioFrame(data, RATE, 1, len(data) // 2))


class Speaker(AudioOutput):
    """The session's audio output: plays each segment out at once, and counts its frames."""

    def __init__(self) -> None:
        super().__init__(label="test speaker", capabilities=AudioOutputCapabilities(pause=False))
        self.frames = 0
        self._segment_s = 0.0

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        if self._segment_s == 0.0:
            self.on_playback_started(created_at=time.time())
        await super().capture_frame(frame)
        self.frames += 1
        self._segment_s += frame.duration

    def flush(self) -> None:
        super().flush()
        self._finish(interrupted=False)

    def clear_buffer(self) -> None:
        self._finish(interrupted=True)

    def _finish(self, *, interrupted: bool) -> None:
        if self._segment_s > 0.0:
            played_s, self._segment_s = self._segment_s, 0.0
            self.on_playback_finished(playback_position=played_s, interrupted=interrupted)


@dataclass
class Agents:
    session: AgentSession
    microphone: Microphone
    speaker: Speaker
    errors: list[ErrorEvent]
    added: asyncio.Queue[llm.ChatMessage]


@pytest.fixture
async def agents(server: Server) -> AsyncIterator[Agents]:
    async with aiohttp.ClientSession() as http:
        model = RealtimeModel(model="tiny", base_url=server.base_url + "/v1", api_key="unused", http_session=http)
        session: AgentSession = AgentSession(llm=model)
        microphone, speaker = Microphone(), Speaker()
        session.input.audio, session.output.audio = microphone, speaker
        errors: list[ErrorEvent] = []
        added: asyncio.Queue[llm.ChatMessage] = asyncio.Queue()
        session.on("error", errors.append)

        @session.on("conversation_item_added")
        def _added(event: ConversationItemAddedEvent) -> None:
            if isinstance(event.item, llm.ChatMessage):
                added.put_nowait(event.item)

        await asyncio.wait_for(session.start(Agent(instructions="You are a voice assistant."), record=False), 30)
        try:
            yield Agents(session, microphone, speaker, errors, added)
        finally:
            await session.aclose()
            await model.aclose()


async def _next_reply(added: asyncio.Queue[llm.ChatMessage], timeout_s: float = 60) -> llm.ChatMessage:
    async with asyncio.timeout(timeout_s):
        while (message := await added.get()).role != "assistant":
            pass
    return message


async def test_an_agent_session(agents: Agents, speech: np.ndarray) -> None:  # noqa: F811
    session = agents.session
    # generate_reply: a reply that plays out to the speaker and lands in the history
    handle = session.generate_reply(instructions="Say hello.")
    await asyncio.wait_for(handle.wait_for_playout(), 60)
    assert agents.speaker.frames > 0
    greeting = await _next_reply(agents.added)

    # a spoken turn: the realtime model's turn detection (semantic_vad, LiveKit's default) ends it; a reply follows
    frames = agents.speaker.frames
    agents.microphone.speak(np.concatenate([silence(0.3), speech, silence(AFTER_SPEECH_S)]))
    spoken_reply = await _next_reply(agents.added)
    assert agents.speaker.frames > frames

    history = [item for item in session.history.items if isinstance(item, llm.ChatMessage)]
    assert [m.id for m in history if m.role == "assistant"][:2] == [greeting.id, spoken_reply.id]
    # LiveKit writes a user turn into the history from its input transcript: none until the server transcribes
    assert all(m.text_content for m in history if m.role == "user")
    assert agents.errors == []
