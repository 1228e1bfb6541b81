"""A full LiveKit `AgentSession` (livekit-agents, unmodified) with this server as its realtime model, against the
live tiny server: a microphone and a speaker of our own stand in for a room. generate_reply, a spoken turn, the
session's history (with the user's transcript when transcription is on), an Agent's `@function_tool` called,
run and answered, with no error and no timeout."""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import jsonschema
import numpy as np
import pytest
from livekit import rtc
from livekit.agents import Agent, AgentSession, function_tool, llm
from livekit.agents.voice.events import ConversationItemAddedEvent, ErrorEvent, FunctionToolsExecutedEvent
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


class LampAgent(Agent):
    """An agent with one tool: it records each call's arguments and answers with the lamp's state."""

    def __init__(self) -> None:
        super().__init__(instructions="You are a voice assistant. You can switch the lamp.")
        self.calls: list[bool] = []

    @function_tool
    async def set_lamp(self, on: bool) -> str:
        """Switch the lamp on or off.

        Args:
            on: True to switch it on, False to switch it off.
        """
        self.calls.append(on)
        return json.dumps({"lamp": "on" if on else "off"})


@dataclass
class Agents:
    session: AgentSession
    agent: LampAgent
    microphone: Microphone
    speaker: Speaker
    errors: list[ErrorEvent]
    added: defaultdict[str, asyncio.Queue[llm.ChatMessage]]  # role -> the messages added to the history, in order
    executed: list[FunctionToolsExecutedEvent]


@pytest.fixture
async def agents(server: Server) -> AsyncIterator[Agents]:
    async with aiohttp.ClientSession() as http:
        # LiveKit's defaults: semantic_vad, and input transcription (gpt-4o-mini-transcribe) on
        model = RealtimeModel(model="tiny", base_url=server.base_url + "/v1", api_key="unused", http_session=http)
        session: AgentSession = AgentSession(llm=model)
        microphone, speaker, agent = Microphone(), Speaker(), LampAgent()
        session.input.audio, session.output.audio = microphone, speaker
        errors: list[ErrorEvent] = []
        added: defaultdict[str, asyncio.Queue[llm.ChatMessage]] = defaultdict(asyncio.Queue)
        executed: list[FunctionToolsExecutedEvent] = []
        session.on("error", errors.append)
        session.on("function_tools_executed", executed.append)

        @session.on("conversation_item_added")
        def _added(event: ConversationItemAddedEvent) -> None:
            if isinstance(event.item, llm.ChatMessage):
                added[event.item.role].put_nowait(event.item)

        await asyncio.wait_for(session.start(agent, record=False), 30)
        try:
            yield Agents(session, agent, microphone, speaker, errors, added, executed)
        finally:
            await session.aclose()
            await model.aclose()


async def _next_reply(agents: Agents, timeout_s: float = 60) -> llm.ChatMessage:
    return await asyncio.wait_for(agents.added["assistant"].get(), timeout_s)


async def test_an_agent_session(agents: Agents, speech: np.ndarray) -> None:  # noqa: F811
    session = agents.session
    # generate_reply: a reply that plays out to the speaker and lands in the history
    handle = session.generate_reply(instructions="Say hello.")
    await asyncio.wait_for(handle.wait_for_playout(), 60)
    assert agents.speaker.frames > 0
    greeting = await _next_reply(agents)

    # a spoken turn: the realtime model's turn detection (semantic_vad, LiveKit's default) ends it; a reply follows
    frames = agents.speaker.frames
    agents.microphone.speak(np.concatenate([silence(0.3), speech, silence(AFTER_SPEECH_S)]))
    spoken_reply = await _next_reply(agents)
    assert agents.speaker.frames > frames

    # LiveKit writes the user's turn into the history from its final input transcript (random weights: gibberish,
    # but text), which may come before the reply or after it
    user_turn = await asyncio.wait_for(agents.added["user"].get(), 60)
    assert user_turn.text_content, user_turn
    history = [item for item in session.history.items if isinstance(item, llm.ChatMessage)]
    assert [m.id for m in history if m.role == "assistant"][:2] == [greeting.id, spoken_reply.id]
    assert [(m.id, m.text_content) for m in history if m.role == "user"] == [(user_turn.id, user_turn.text_content)]
    assert agents.errors == []


async def test_an_agent_tool_round_trip(agents: Agents) -> None:
    """generate_reply names the Agent's tool: the server's constrained decoding makes even the random model call
    it; LiveKit runs it, sends its output back and asks for the reply, which plays out."""
    session = agents.session
    named: llm.ToolChoice = {"type": "function", "function": {"name": "set_lamp"}}
    session.generate_reply(instructions="Switch the lamp on.", tool_choice=named)
    reply = await _next_reply(agents, 90)

    assert len(agents.agent.calls) == 1 and isinstance(agents.agent.calls[0], bool), agents.executed
    [executed] = agents.executed
    [(call, output)] = executed.zipped()
    assert call.name == "set_lamp" and output.call_id == call.call_id and not output.is_error
    # against the schema LiveKit sent for the tool (it allows more properties, which a random model writes)
    [tool] = agents.agent.tools
    assert isinstance(tool, llm.FunctionTool)
    jsonschema.validate(
        json.loads(call.arguments), llm.utils.build_legacy_openai_schema(tool, internally_tagged=True)["parameters"]
    )
    assert json.loads(output.output) == {"lamp": "on" if agents.agent.calls[0] else "off"}
    items = session.history.items
    kinds = [(item.type, getattr(item, "role", None)) for item in items]
    assert (
        kinds.index(("function_call", None))
        < kinds.index(("function_call_output", None))
        < [item.id for item in items].index(reply.id)
    ), kinds
    assert agents.speaker.frames > 0
    await asyncio.sleep(0.5)  # an error the follow-up might draw arrives after it
    assert agents.errors == []
