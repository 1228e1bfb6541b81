"""Pipecat's own OpenAI realtime service (`OpenAIRealtimeLLMService`, unmodified) in a Pipecat pipeline against
the live tiny server: a source and a sink of our own stand in for a transport. A greeting from the context,
spoken turns, barge-in, history in its context (the user's transcripts too, when transcription is on),
conversation.item.retrieve, a registered function called, run and answered, and an edited history taken up by a
new session, with no error and no timeout."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import jsonschema
import numpy as np
import pytest
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    InterruptionFrame,
    LLMMessagesAppendFrame,
    LLMMessagesUpdateFrame,
    LLMRunFrame,
    LLMUpdateSettingsFrame,
    TTSAudioRawFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams
from pipecat.services.openai.realtime.events import (
    AudioConfiguration,
    AudioInput,
    InputAudioNoiseReduction,
    InputAudioTranscription,
    SemanticTurnDetection,
    SessionProperties,
)
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

from tests.conftest import Server
from tests.integration.test_realtime import RATE, pcm16, silence, speech  # noqa: F401 (the fixture)

# the service's tasks live on the loop its fixture made them on: the tests share that loop
pytestmark = pytest.mark.asyncio(loop_scope="session")
# The silence sent after each utterance: semantic_vad's clock is the audio, so a turn it holds open ends only
# once this much silence has arrived (its longest wait is 4 s at eagerness auto), as a live microphone sends it.
AFTER_SPEECH_S = 4.5

_WEATHER = FunctionSchema(name="get_current_weather", description="Get the current weather",
                          properties={"location": {"type": "string"},
                                      "format": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                          required=["location", "format"])
# a tool the random model's call always ends in: its arguments hold no string (the weather's location is one,
# which a random model need not ever close)
_LAMP = FunctionSchema(name="set_lamp", description="Switch the lamp", properties={"on": {"type": "boolean"}},
                       required=["on"])


def _default_settings() -> OpenAIRealtimeLLMService.Settings:
    """The service's defaults; the model names the one this server serves, as with OpenAI."""
    return OpenAIRealtimeLLMService.Settings(model="tiny")


def _example_settings() -> OpenAIRealtimeLLMService.Settings:
    """examples/realtime/realtime-openai.py's: semantic_vad, transcription, near-field noise reduction."""
    return OpenAIRealtimeLLMService.Settings(
        model="tiny",
        system_instruction="You are a helpful and friendly AI. Keep your responses short.",
        session_properties=SessionProperties(audio=AudioConfiguration(input=AudioInput(
            transcription=InputAudioTranscription(), turn_detection=SemanticTurnDetection(),
            noise_reduction=InputAudioNoiseReduction(type="near_field")))))


def _tool_settings() -> OpenAIRealtimeLLMService.Settings:
    """The defaults, with a tool call required: Pipecat's one way to make the model call (its tool_choice)."""
    return OpenAIRealtimeLLMService.Settings(model="tiny", session_properties=SessionProperties(tool_choice="required"))


SETTINGS = {"defaults": _default_settings, "example": _example_settings, "tool_required": _tool_settings}


async def end_pipeline(worker: PipelineWorker, running: asyncio.Task) -> None:
    """End a pipeline the way a call ends, and cancel it if it does not finish within 20 s."""
    await worker.queue_frame(EndFrame())
    try:
        await asyncio.wait_for(running, 20)
    except TimeoutError:
        await worker.cancel()


class Microphone(FrameProcessor):
    """The pipeline's source: speech pushed as the input audio frames a transport would make."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)

    async def speak(self, samples_24k: np.ndarray, chunk_s: float = 0.1) -> None:
        step = int(chunk_s * RATE)
        for i in range(0, samples_24k.size, step):
            frame = InputAudioRawFrame(audio=pcm16(samples_24k[i : i + step]), sample_rate=RATE, num_channels=1)
            await self.push_frame(frame)
            await asyncio.sleep(0)


class Speaker(FrameProcessor):
    """The pipeline's sink: counts the reply audio that reaches it, and passes every frame on."""

    def __init__(self) -> None:
        super().__init__()
        self.audio_frames = 0
        self.audio_arrived = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.audio_frames += 1
            self.audio_arrived.set()
        await self.push_frame(frame, direction)


class Seen(BaseObserver):
    """Every error and interruption that travels the pipeline."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[ErrorFrame] = []
        self.interruptions = 0

    async def on_push_frame(self, data: FramePushed) -> None:
        if isinstance(data.frame, ErrorFrame) and data.frame not in self.errors:
            self.errors.append(data.frame)
        elif isinstance(data.frame, InterruptionFrame):
            self.interruptions += 1


@dataclass
class Bot:
    llm: OpenAIRealtimeLLMService
    context: LLMContext
    microphone: Microphone
    speaker: Speaker
    seen: Seen
    items: list[tuple[str, str]]  # (id, role) of every item the server announced
    calls: list[FunctionCallParams]  # every call of the registered function, as Pipecat made it

    async def reply_audio(self, timeout_s: float = 60) -> int:
        """Waits for reply audio to reach the sink; the frames so far."""
        self.speaker.audio_arrived.clear()
        await asyncio.wait_for(self.speaker.audio_arrived.wait(), timeout_s)
        return self.speaker.audio_frames


@pytest.fixture
async def bot(server: Server, request: pytest.FixtureRequest) -> AsyncIterator[Bot]:
    ws_url = server.base_url.replace("http://", "ws://") + "/v1/realtime"
    llm = OpenAIRealtimeLLMService(api_key="unused", base_url=ws_url, settings=SETTINGS[request.param]())
    items: list[tuple[str, str]] = []
    calls: list[FunctionCallParams] = []

    async def run_tool(params: FunctionCallParams) -> None:
        calls.append(params)
        if request.param == "tool_required":
            # the call is made: the follow-up may answer in words (a required choice would call again), so the
            # tool choice goes back to auto first, by Pipecat's settings update, queued ahead of the result
            await params.llm.queue_frame(LLMUpdateSettingsFrame(delta=OpenAIRealtimeLLMService.Settings(
                session_properties=SessionProperties(tool_choice="auto"))))
        if params.function_name == "set_lamp":
            await params.result_callback({"lamp": "on" if params.arguments["on"] else "off"})
        else:
            await params.result_callback({"conditions": "nice", "temperature": 24,
                                          "format": params.arguments.get("format")})

    llm.register_function("get_current_weather", run_tool)
    llm.register_function("set_lamp", run_tool)

    @llm.event_handler("on_conversation_item_created")
    async def created(_: OpenAIRealtimeLLMService, item_id: str, item: object) -> None:
        items.append((item_id, getattr(item, "role", "") or ""))

    # the example's context: a developer message that asks for a greeting, and its tools
    tools = [_LAMP] if request.param == "tool_required" else [_WEATHER]
    context = LLMContext([{"role": "developer", "content": "Say hello!"}], ToolsSchema(standard_tools=tools))
    user, assistant = LLMContextAggregatorPair(context)
    microphone, speaker, seen = Microphone(), Speaker(), Seen()
    worker = PipelineWorker(Pipeline([microphone, user, llm, speaker, assistant]), params=PipelineParams(),
                            observers=[seen], idle_timeout_secs=None, enable_rtvi=False)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    try:
        yield Bot(llm, context, microphone, speaker, seen, items, calls)
    finally:
        await end_pipeline(worker, running)


def session_errors(server: Server, log_from: int, *expected: str) -> list[str]:
    """The error events the server logged since `log_from`, but for the codes named."""
    return [line for line in server.log()[log_from:].splitlines()
            if " error " in line and not any(code in line for code in expected)]


@pytest.mark.parametrize("bot", ["defaults", "example"], indirect=True)
async def test_a_pipecat_pipeline(bot: Bot, server: Server, speech: np.ndarray,  # noqa: F811
                                  request: pytest.FixtureRequest) -> None:
    log_from = len(server.log())
    # the greeting: the context goes in as items, then a response whose audio reaches the sink
    await bot.microphone.queue_frame(LLMRunFrame())
    await bot.reply_audio()

    # a spoken turn: the server's turn detection commits it and answers; barge in on that reply
    await bot.microphone.speak(np.concatenate([silence(0.3), speech, silence(AFTER_SPEECH_S)]))
    await bot.reply_audio()
    interruptions = bot.seen.interruptions
    await bot.microphone.speak(np.concatenate([speech, silence(AFTER_SPEECH_S)]))
    async with asyncio.timeout(10):
        while bot.seen.interruptions == interruptions:
            await asyncio.sleep(0.05)
    await bot.reply_audio()  # the reply to the turn that interrupted

    # history: the context holds the replies' text, and with transcription on (the example) the user's turns as
    # their transcripts (random weights: gibberish, but text); the server announced each turn's item and has it
    await asyncio.sleep(1.0)
    assistant_texts = [m for m in bot.context.get_messages() if m.get("role") == "assistant"]
    assert len(assistant_texts) >= 2, bot.context.get_messages()
    if request.node.callspec.params["bot"] == "example":  # transcription on
        # a transcript comes after its turn's end: Pipecat's aggregators write it into the context when they
        # flush, with the next reply's end, and two turns' transcripts may share one message
        async with asyncio.timeout(30):
            while not (user_texts := [m for m in bot.context.get_messages() if m.get("role") == "user"]):
                await asyncio.sleep(0.1)
        assert all(isinstance(m.get("content"), str) and m["content"].strip() for m in user_texts), user_texts
    assert len([item_id for item_id, role in bot.items if role == "user"]) >= 2, bot.items
    assistant_items = [item_id for item_id, role in bot.items if role == "assistant"]
    retrieved = await asyncio.wait_for(bot.llm.retrieve_conversation_item(assistant_items[0]), 10)
    assert retrieved.id == assistant_items[0] and retrieved.role == "assistant"
    with pytest.raises(Exception, match="does not exist"):  # an unknown id fails the call, not the session
        await asyncio.wait_for(bot.llm.retrieve_conversation_item("item_missing"), 10)

    assert bot.seen.errors == []
    assert session_errors(server, log_from, "item_retrieve_invalid_item_id") == []


@pytest.mark.parametrize("bot", ["tool_required"], indirect=True)
async def test_a_pipecat_tool_round_trip(bot: Bot, server: Server) -> None:
    """The greeting is a call: the required tool choice decodes it under the function's schema (so even the random
    model's arguments validate); Pipecat runs the registered function, sends its function_call_output and asks for
    the reply, which speaks."""
    log_from = len(server.log())
    await bot.microphone.queue_frame(LLMRunFrame())
    await bot.reply_audio(90)

    [call] = bot.calls
    assert call.function_name == "set_lamp"
    jsonschema.validate(dict(call.arguments), {"type": "object", "properties": _LAMP.properties,
                                               "required": _LAMP.required})
    # the reply's words reach the context once it is done, after the call and its result
    async with asyncio.timeout(30):
        while (messages := bot.context.get_messages())[-1].get("role") != "assistant" or \
                not messages[-1].get("content"):
            await asyncio.sleep(0.1)
    [result] = [m for m in messages if m.get("role") == "tool"]
    assert result["tool_call_id"] == call.tool_call_id
    assert json.loads(result["content"]) == {"lamp": "on" if call.arguments["on"] else "off"}
    assert [m["role"] for m in messages] == ["developer", "assistant", "tool", "assistant"], messages
    assert messages[1]["tool_calls"][0]["id"] == call.tool_call_id
    assert len(bot.calls) == 1  # the reply after the result is words: the choice is auto again
    assert bot.seen.errors == []
    assert session_errors(server, log_from) == []


@pytest.mark.parametrize("bot", ["defaults"], indirect=True)
async def test_a_pipecat_history_edit(bot: Bot, server: Server) -> None:
    """What Pipecat's realtime service sends of an edited context: a message appended (LLMMessagesAppendFrame) goes
    in as an item and is answered; a context replaced (LLMMessagesUpdateFrame) stays local until
    `reset_conversation()`, which ends the session and opens a new one."""
    log_from = len(server.log())
    await bot.microphone.queue_frame(LLMRunFrame())
    await bot.reply_audio()
    await asyncio.sleep(1.0)

    # appended past the user aggregator, as Pipecat's own tools do: the service sends it as a system item
    before = len(bot.items)
    await bot.llm.queue_frame(LLMMessagesAppendFrame([{"role": "developer", "content": "Now say goodbye."}],
                                                     run_llm=True))
    async with asyncio.timeout(60):  # the reply to it: an assistant item, then its audio
        while "assistant" not in [role for _, role in bot.items[before:]]:
            await asyncio.sleep(0.05)
    await bot.reply_audio()
    assert [role for _, role in bot.items[before:]][:2] == ["system", "assistant"], bot.items[before:]

    # replaced: nothing goes out until the reset, whose new session starts without the old items
    edited = [{"role": "developer", "content": "Say hello again!"}]
    await bot.microphone.queue_frame(LLMMessagesUpdateFrame(messages=edited, run_llm=False))
    async with asyncio.timeout(10):
        while bot.context.get_messages() != edited:
            await asyncio.sleep(0.05)
    await asyncio.wait_for(bot.llm.reset_conversation(), 20)
    async with asyncio.timeout(10):
        while server.log()[log_from:].count(" opened (") < 2 or " closed" not in server.log()[log_from:]:
            await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)
    assert bot.seen.errors == []
    assert session_errors(server, log_from) == []
