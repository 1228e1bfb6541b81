"""Pipecat's own OpenAI realtime service (`OpenAIRealtimeLLMService`, unmodified) in a Pipecat pipeline against
the live tiny server: a source and a sink of our own stand in for a transport. A greeting from the context,
spoken turns, barge-in, history in its context, conversation.item.retrieve, with no error and no timeout."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

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
    LLMRunFrame,
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


SETTINGS = {"defaults": _default_settings, "example": _example_settings}


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

    async def reply_audio(self, timeout_s: float = 60) -> int:
        """Waits for reply audio to reach the sink; the frames so far."""
        self.speaker.audio_arrived.clear()
        await asyncio.wait_for(self.speaker.audio_arrived.wait(), timeout_s)
        return self.speaker.audio_frames


@pytest.fixture
async def bot(server: Server, request: pytest.FixtureRequest) -> AsyncIterator[Bot]:
    ws_url = server.base_url.replace("http://", "ws://") + "/v1/realtime"
    llm = OpenAIRealtimeLLMService(api_key="unused", base_url=ws_url, settings=SETTINGS[request.param]())
    llm.register_function("get_current_weather", _weather)
    items: list[tuple[str, str]] = []

    @llm.event_handler("on_conversation_item_created")
    async def created(_: OpenAIRealtimeLLMService, item_id: str, item: object) -> None:
        items.append((item_id, getattr(item, "role", "") or ""))

    # the example's context: a developer message that asks for a greeting, and its tools
    context = LLMContext([{"role": "developer", "content": "Say hello!"}], ToolsSchema(standard_tools=[_WEATHER]))
    user, assistant = LLMContextAggregatorPair(context)
    microphone, speaker, seen = Microphone(), Speaker(), Seen()
    worker = PipelineWorker(Pipeline([microphone, user, llm, speaker, assistant]), params=PipelineParams(),
                            observers=[seen], idle_timeout_secs=None, enable_rtvi=False)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    try:
        yield Bot(llm, context, microphone, speaker, seen, items)
    finally:
        await worker.queue_frame(EndFrame())
        try:
            await asyncio.wait_for(running, 20)
        except TimeoutError:
            await worker.cancel()


async def _weather(params: FunctionCallParams) -> None:
    await params.result_callback({"conditions": "nice", "temperature": 24, "format": params.arguments["format"]})


@pytest.mark.parametrize("bot", list(SETTINGS), indirect=True)
async def test_a_pipecat_pipeline(bot: Bot, server: Server, speech: np.ndarray) -> None:  # noqa: F811
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

    # history: the context holds the replies' text (user turns reach it only as input transcripts, which this
    # server does not make yet); the server announced each turn's item and has it
    await asyncio.sleep(1.0)
    assistant_texts = [m for m in bot.context.get_messages() if m.get("role") == "assistant"]
    assert len(assistant_texts) >= 2, bot.context.get_messages()
    assert len([item_id for item_id, role in bot.items if role == "user"]) >= 2, bot.items
    assistant_items = [item_id for item_id, role in bot.items if role == "assistant"]
    retrieved = await asyncio.wait_for(bot.llm.retrieve_conversation_item(assistant_items[0]), 10)
    assert retrieved.id == assistant_items[0] and retrieved.role == "assistant"
    with pytest.raises(Exception, match="does not exist"):  # an unknown id fails the call, not the session
        await asyncio.wait_for(bot.llm.retrieve_conversation_item("item_missing"), 10)

    assert bot.seen.errors == []
    session_errors = [line for line in server.log()[log_from:].splitlines()
                      if " error " in line and "item_retrieve_invalid_item_id" not in line]
    assert session_errors == []
