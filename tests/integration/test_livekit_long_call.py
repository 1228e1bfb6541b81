"""A slow tool in a long call, through LiveKit Agents' own OpenAI realtime client (`livekit-plugins-openai`,
unmodified) against the live tiny server: the tool's result comes only after the user spoke again and the reply
to that turn began, and it still joins the conversation and the prompt of the reply after it.

Driven twice: by the plugin's `RealtimeSession` alone, the test sending the result as LiveKit's AgentActivity
sends a tool's output (the session's chat context plus the output, through `update_chat_ctx`), and by a whole
`AgentSession` whose tool is one of LiveKit's async tools (`ctx.update()` answers the call at once; the result
comes later as a call and an output of its own, `{call_id}_final`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import numpy as np
import pytest
from livekit.agents import Agent, AgentSession, RunContext, function_tool, llm
from livekit.agents.metrics import RealtimeModelMetrics
from livekit.agents.voice.events import ErrorEvent, ToolExecutionUpdatedEvent, ToolReplyUpdated
from livekit.plugins.openai.realtime import RealtimeModel, RealtimeSession
from openai.types.realtime.realtime_truncation_retention_ratio import RealtimeTruncationRetentionRatio

from tests.conftest import Server
from tests.integration.test_livekit_agent_session import Microphone, Speaker
from tests.integration.test_livekit_agents import AFTER_SPEECH_S, heard, push_speech
from tests.integration.test_realtime import silence, speech  # noqa: F401 (the fixture)

pytestmark = pytest.mark.asyncio(loop_scope="session")

# The slow tool's result: Qwen's pre-tokenizer splits numbers into single digits, so these digits alone are
# at least READINGS_TOKENS tokens of any prompt that holds the result.
READINGS_TOKENS = 200
RESULT = json.dumps({"forecast": "rain", "readings": "".join(str(i % 10) for i in range(READINGS_TOKENS))})
# Its one argument is a boolean: a random model need not ever close a string argument.
NAMED: llm.ToolChoice = {"type": "function", "function": {"name": "get_weather"}}


@function_tool
async def get_weather(celsius: bool) -> str:
    """Look up the weather here; it takes a while.

    Args:
        celsius: True for degrees Celsius, False for Fahrenheit.
    """
    raise AssertionError("the test delivers this tool's output itself")


def _text_tokens(metrics: RealtimeModelMetrics) -> int:
    assert metrics.input_token_details is not None, metrics
    return metrics.input_token_details.text_tokens


@pytest.fixture
async def realtime(server: Server) -> AsyncIterator[tuple[RealtimeSession, list]]:
    errors: list = []
    async with aiohttp.ClientSession() as http:
        # LiveKit's defaults: semantic_vad, input transcription on
        model = RealtimeModel(model="tiny", base_url=server.base_url + "/v1", api_key="unused", http_session=http)
        session = model.session()
        session.on("error", errors.append)
        yield session, errors
        await session.aclose()
        await model.aclose()


async def test_a_tool_result_after_the_user_spoke_again(realtime: tuple[RealtimeSession, list],
                                                        speech: np.ndarray) -> None:  # noqa: F811
    """The call completes; the user speaks and the reply to that turn begins; only then the output comes, while
    that reply runs. The server announces it, and the next reply's prompt holds it."""
    session, errors = realtime
    generations: asyncio.Queue[llm.GenerationCreatedEvent] = asyncio.Queue()
    usage: dict[str, RealtimeModelMetrics] = {}  # by response id

    @session.on("metrics_collected")
    def _metrics(metrics: object) -> None:
        if isinstance(metrics, RealtimeModelMetrics):  # not the transcriptions'
            usage[metrics.request_id] = metrics

    session.on("generation_created", generations.put_nowait)
    await asyncio.wait_for(session.update_tools([get_weather]), 10)

    # the call: the named tool choice decodes it under the function's schema
    asked = await asyncio.wait_for(session.generate_reply(tool_choice=NAMED), 10)
    await generations.get()  # the same generation, announced too
    calls = await asyncio.wait_for(_calls(asked), 60)
    assert [c.name for c in calls] == ["get_weather"], calls
    [call] = calls

    # the tool is still running: the user speaks again, turn detection commits the turn and a reply begins
    await push_speech(session, np.concatenate([silence(0.3), speech, silence(AFTER_SPEECH_S)]))
    spoken = await asyncio.wait_for(generations.get(), 60)
    assert not spoken.user_initiated
    kinds = [(item.type, getattr(item, "role", None)) for item in session.chat_ctx.items]
    assert kinds.index(("function_call", None)) < kinds.index(("message", "user")), kinds

    # only now the result, while that reply runs, as AgentActivity sends a tool's output
    context = session.chat_ctx.copy()
    context.items.append(llm.FunctionCallOutput(call_id=call.call_id, name=call.name, output=RESULT, is_error=False))
    await asyncio.wait_for(session.update_chat_ctx(context), 10)
    # the server announced it (the plugin's copy of the server's conversation holds only what was announced)
    [output] = [item for item in session.chat_ctx.items if item.type == "function_call_output"]
    assert output.call_id == call.call_id and output.output == RESULT
    await asyncio.wait_for(heard(spoken), 60)

    # the next reply's prompt holds the result: its text grew by the result's digits at least
    after = await asyncio.wait_for(session.generate_reply(), 10)
    await generations.get()
    await asyncio.wait_for(heard(after), 60)
    async with asyncio.timeout(10):
        while after.response_id not in usage:
            await asyncio.sleep(0.05)
    grown = _text_tokens(usage[after.response_id]) - _text_tokens(usage[spoken.response_id])
    assert grown >= READINGS_TOKENS, (usage[spoken.response_id], usage[after.response_id])
    await asyncio.sleep(0.3)
    assert errors == []


async def _calls(generation: llm.GenerationCreatedEvent) -> list[llm.FunctionCall]:
    """The generation's calls, once it is done (its messages read and dropped)."""
    async def drain_messages() -> None:
        async for message in generation.message_stream:
            async for _ in message.audio_stream:
                pass

    reader = asyncio.create_task(drain_messages())
    calls = [call async for call in generation.function_stream]
    await reader
    return calls


class WeatherAgent(Agent):
    """An agent with one of LiveKit's async tools: it answers the call at once with a progress update, and
    returns its result once the test lets it."""

    def __init__(self) -> None:
        super().__init__(instructions="You are a voice assistant. You can look up the weather.")
        self.release = asyncio.Event()
        self.call_ids: list[str] = []

    @function_tool
    async def get_weather(self, ctx: RunContext, celsius: bool) -> str:
        """Look up the weather here; it takes a while.

        Args:
            celsius: True for degrees Celsius, False for Fahrenheit.
        """
        self.call_ids.append(ctx.function_call.call_id)
        await ctx.update("Looking it up.")
        await self.release.wait()
        return RESULT


async def test_an_async_tool_result_after_the_user_spoke_again(server: Server, speech: np.ndarray) -> None:  # noqa: F811
    """LiveKit's async tool: `ctx.update()` answers the call and the reply to it plays; the user speaks, and
    once the reply to that turn has begun the tool returns. LiveKit sends the result as a call and an output of
    their own (`{call_id}_final`) and asks for a reply when the session is idle; that reply's prompt holds it."""
    async with aiohttp.ClientSession() as http:
        # the result is weighed as what the last prompt's text gained over the spoken turn's: a cut between the two
        # would take older text out of the last one. Auto keeps half of the tiny context at a cut, and its first cut
        # can come that early; this call keeps three quarters, whose first cut comes later
        keep_more = RealtimeTruncationRetentionRatio(type="retention_ratio", retention_ratio=0.75)
        model = RealtimeModel(model="tiny", base_url=server.base_url + "/v1", api_key="unused", http_session=http,
                              truncation=keep_more)
        session: AgentSession = AgentSession(llm=model)
        microphone, speaker, agent = Microphone(), Speaker(), WeatherAgent()
        session.input.audio, session.output.audio = microphone, speaker
        errors: list[ErrorEvent] = []
        replies: list[ToolReplyUpdated] = []
        session.on("error", errors.append)

        @session.on("tool_execution_updated")
        def _updated(event: ToolExecutionUpdatedEvent) -> None:
            if isinstance(event.update, ToolReplyUpdated):
                replies.append(event.update)

        await asyncio.wait_for(session.start(agent, record=False), 30)
        try:
            realtime = agent.realtime_llm_session
            server_turns: asyncio.Queue[llm.GenerationCreatedEvent] = asyncio.Queue()
            usage: list[RealtimeModelMetrics] = []

            @realtime.on("generation_created")
            def _created(generation: llm.GenerationCreatedEvent) -> None:
                if not generation.user_initiated:  # turn detection's, not LiveKit's generate_reply
                    server_turns.put_nowait(generation)

            @realtime.on("metrics_collected")
            def _metrics(metrics: object) -> None:
                if isinstance(metrics, RealtimeModelMetrics):  # not the transcriptions'
                    usage.append(metrics)

            # the call (named, so the random model makes it); its update answers it and a reply to that plays
            handle = session.generate_reply(instructions="What is the weather?", tool_choice=NAMED)
            await asyncio.wait_for(handle.wait_for_playout(), 90)
            async with asyncio.timeout(60):
                while not (agent.call_ids and usage and session.current_speech is None):
                    await asyncio.sleep(0.05)
            [call_id] = agent.call_ids

            # the tool still runs: the user speaks again; the reply to that turn begins, then the result comes
            microphone.speak(np.concatenate([silence(0.3), speech, silence(AFTER_SPEECH_S)]))
            spoken = await asyncio.wait_for(server_turns.get(), 60)
            agent.release.set()

            async with asyncio.timeout(90):
                while not any(r.status != "scheduled" for r in replies):
                    await asyncio.sleep(0.05)
            assert [(r.update_ids, r.status) for r in replies] == [([f"{call_id}_final"], "scheduled"),
                                                                   ([f"{call_id}_final"], "completed")], replies
            # the server announced the call and the output LiveKit made for the result (under an id of its own:
            # LiveKit shortens a call id past OpenAI's 32 characters), after the user's turn
            items = realtime.chat_ctx.items
            [final] = [i for i, item in enumerate(items) if isinstance(item, llm.FunctionCallOutput)
                       and item.output == RESULT]
            final_call_id = items[final].call_id
            kinds = [(item.type, getattr(item, "call_id", None) or getattr(item, "role", None)) for item in items]
            assert kinds.index(("message", "user")) < kinds.index(("function_call", final_call_id)) < final, kinds
            # and the reply LiveKit asked for heard it: its prompt's text outgrew the spoken turn's by the result's
            # digits at least
            [spoken_usage] = [m for m in usage if m.request_id == spoken.response_id]
            assert _text_tokens(usage[-1]) - _text_tokens(spoken_usage) >= READINGS_TOKENS, usage
            await asyncio.sleep(0.3)
            assert errors == []
        finally:
            await session.aclose()
            await model.aclose()
