"""Long calls through Pipecat's own OpenAI realtime service (`OpenAIRealtimeLLMService`, unmodified) in a Pipecat
pipeline against the live tiny server: an async tool whose result comes only after the user spoke again, and the
session properties Pipecat sends that matter in a long call.

What Pipecat 1.14 can send of a long call's settings (pipecat/services/openai/realtime/events.py,
`SessionProperties`): `max_output_tokens` (an int or "inf"), `tracing`, `prompt`, `expires_at`, `include`,
`reasoning` (which it strips for a model whose name is not a gpt-realtime-2's). It has no `truncation` field and
its pydantic model ignores unknown keys, so `SessionProperties(truncation=...)` is dropped before it is sent; its
`TurnDetection` has no `idle_timeout_ms` either. A Pipecat session therefore always runs under the server's default
truncation, "auto". Pipecat's context summarisation (`enable_auto_context_summarization`) never reaches the
server: it calls the service's `run_inference()`, which the realtime service does not implement, and it edits the
local context only, which the realtime service does not send again until `reset_conversation()`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import numpy as np
import pytest
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import LLMMessagesAppendFrame, LLMRunFrame, LLMUpdateSettingsFrame, MetricsFrame
from pipecat.metrics.metrics import LLMTokenUsage, LLMUsageMetricsData
from pipecat.observers.base_observer import FramePushed
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.services.llm_service import FunctionCallParams
from pipecat.services.openai.realtime.events import SessionProperties
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

from tests.conftest import Server
from tests.integration.test_pipecat import (
    _LAMP,
    AFTER_SPEECH_S,
    Microphone,
    Seen,
    Speaker,
    end_pipeline,
    session_errors,
)
from tests.integration.test_realtime import silence, speech  # noqa: F401 (the fixture)

pytestmark = pytest.mark.asyncio(loop_scope="session")

# The slow tool's result: Qwen's pre-tokenizer splits numbers into single digits, so these digits alone are
# at least READINGS_TOKENS tokens of any prompt that holds the result.
READINGS_TOKENS = 200
RESULT = {"lamp": "on", "readings": "".join(str(i % 10) for i in range(READINGS_TOKENS))}


class Observed(Seen):
    """Seen's errors and interruptions, and the token usage of each response, in the order they ended."""

    def __init__(self) -> None:
        super().__init__()
        self.usage: list[LLMTokenUsage] = []
        self._metrics: set[int] = set()

    async def on_push_frame(self, data: FramePushed) -> None:
        await super().on_push_frame(data)
        if isinstance(data.frame, MetricsFrame) and data.frame.id not in self._metrics:
            self._metrics.add(data.frame.id)
            self.usage += [d.value for d in data.frame.data if isinstance(d, LLMUsageMetricsData)]


@dataclass
class Call:
    llm: OpenAIRealtimeLLMService
    context: LLMContext
    microphone: Microphone
    speaker: Speaker
    seen: Observed
    items: list[dict] = field(default_factory=list)  # every item the server announced: id, type, role, call_id


@asynccontextmanager
async def call_on(llm: OpenAIRealtimeLLMService, context: LLMContext) -> AsyncIterator[Call]:
    """A pipeline around `llm`, as test_pipecat's, with usage metrics on; ended when the block is."""
    user, assistant = LLMContextAggregatorPair(context)
    microphone, speaker, seen = Microphone(), Speaker(), Observed()
    call = Call(llm, context, microphone, speaker, seen)

    @llm.event_handler("on_conversation_item_created")
    async def created(_: OpenAIRealtimeLLMService, item_id: str, item: object) -> None:
        call.items.append({"id": item_id, "type": getattr(item, "type", None), "role": getattr(item, "role", None),
                           "call_id": getattr(item, "call_id", None)})

    worker = PipelineWorker(Pipeline([microphone, user, llm, speaker, assistant]),
                            params=PipelineParams(enable_metrics=True, enable_usage_metrics=True),
                            observers=[seen], idle_timeout_secs=None, enable_rtvi=False)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    try:
        yield call
    finally:
        await end_pipeline(worker, running)


def _text_tokens(usage: LLMTokenUsage) -> int:
    return usage.prompt_tokens - (usage.input_audio_tokens or 0)


async def _until(condition: Callable[[], object], timeout_s: float = 60) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.05)


async def test_an_async_tool_result_after_the_user_spoke_again(server: Server, speech: np.ndarray) -> None:  # noqa: F811
    """Pipecat's async tool (`cancel_on_interruption=False`): the call is made (a required tool choice makes the
    random model make it) and the model runs on; the user speaks, the reply to that turn begins, and only then
    the tool returns. Pipecat sends the result as the call's function_call_output at once, asks for a response,
    holds it while the turn's reply runs and creates it after: that reply's prompt holds the result."""
    log_from = len(server.log())
    release = asyncio.Event()
    calls: list[FunctionCallParams] = []

    async def set_lamp(params: FunctionCallParams) -> None:
        calls.append(params)
        # the call is made: the turns after it may answer in words (a required choice would call again)
        await params.llm.queue_frame(LLMUpdateSettingsFrame(delta=OpenAIRealtimeLLMService.Settings(
            session_properties=SessionProperties(tool_choice="auto"))))
        await release.wait()
        await params.result_callback(RESULT)

    llm = OpenAIRealtimeLLMService(
        api_key="unused", base_url=server.base_url.replace("http://", "ws://") + "/v1/realtime",
        settings=OpenAIRealtimeLLMService.Settings(model="tiny",
                                                   session_properties=SessionProperties(tool_choice="required")))
    llm.register_function("set_lamp", set_lamp, cancel_on_interruption=False)
    context = LLMContext([{"role": "developer", "content": "Switch the lamp on."}], ToolsSchema(standard_tools=[_LAMP]))
    async with call_on(llm, context) as call:
        await call.microphone.queue_frame(LLMRunFrame())
        await _until(lambda: calls and len(call.seen.usage) == 1, 90)  # the call's response is done
        assert call.speaker.audio_frames == 0  # it was a call and nothing else

        # the tool is still running: the user speaks again; turn detection commits the turn and a reply begins
        await call.microphone.speak(np.concatenate([silence(0.3), speech, silence(AFTER_SPEECH_S)]))
        await asyncio.wait_for(call.speaker.audio_arrived.wait(), 60)
        assert [i["type"] for i in call.items if i["role"] == "user" or i["type"] == "function_call"][-2:] == \
            ["function_call", "message"], call.items
        release.set()

        # the result goes in as the call's output at once, and the response Pipecat asks for then (held until the
        # turn's reply is done) takes it in
        await _until(lambda: len(call.seen.usage) == 3)
        [output] = [i for i in call.items if i["type"] == "function_call_output"]
        assert output["call_id"] == calls[0].tool_call_id
        kinds = [i["type"] if i["type"] != "message" else i["role"] for i in call.items]
        # after the call: the user's turn, the reply to it (begun before the result), the result, the reply to it
        assert kinds[kinds.index("function_call"):] == ["function_call", "user", "assistant", "function_call_output",
                                                        "assistant"], kinds
        retrieved = await asyncio.wait_for(call.llm.retrieve_conversation_item(output["id"]), 10)
        assert json.loads(retrieved.output) == RESULT
        spoken, answered = call.seen.usage[1:]
        assert _text_tokens(answered) - _text_tokens(spoken) >= READINGS_TOKENS, call.seen.usage
        await asyncio.sleep(0.5)
        assert len(calls) == 1 and len(call.seen.usage) == 3, call.seen.usage
        assert call.seen.errors == []
    assert session_errors(server, log_from) == []


# A long call's history, put in as Pipecat's own tools put messages in (LLMMessagesAppendFrame: each one a
# conversation item). Either kind alone outgrows the tiny model's 1,024-token context: the words at about 60
# tokens a note, the readings at one token a character (Qwen's pre-tokenizer splits numbers into single digits).
NOTES = {
    "words": [f"note {i}: " + "the quick brown fox jumps over the lazy dog " * 6 for i in range(20)],
    "readings": [f"readings {i}: " + " ".join(f"{(i * 7919 + j * 104729) % 10_000:04d}" for j in range(50))
                 for i in range(20)],
}
MAX_OUTPUT_TOKENS = 8


@pytest.mark.parametrize("notes", ["words", "readings"])
async def test_a_long_call_with_pipecats_settings(server: Server, speech: np.ndarray, notes: str) -> None:  # noqa: F811
    """Pipecat's settings that bear on a long call, as it sends them: `max_output_tokens` caps every reply, and
    with no way to send `truncation` the server's "auto" governs. A history past the context is cut a block at
    once: the reply completes, the turn after the cut reuses the cached prefix, and the oldest item, out of
    the prompt, is still in the conversation."""
    log_from = len(server.log())
    llm = OpenAIRealtimeLLMService(
        api_key="unused", base_url=server.base_url.replace("http://", "ws://") + "/v1/realtime",
        settings=OpenAIRealtimeLLMService.Settings(model="tiny", session_properties=SessionProperties(
            max_output_tokens=MAX_OUTPUT_TOKENS, tracing="auto")))
    context = LLMContext([{"role": "developer", "content": "Say hello!"}])
    async with call_on(llm, context) as call:
        await call.microphone.queue_frame(LLMRunFrame())
        await _until(lambda: len(call.seen.usage) == 1)

        # the history outgrows the context; the reply it asks for completes with the oldest items cut
        await call.llm.queue_frame(LLMMessagesAppendFrame(
            [{"role": "developer", "content": note} for note in NOTES[notes]], run_llm=True))
        await _until(lambda: len(call.seen.usage) == 2)
        assert call.seen.errors == []
        cut = call.seen.usage[1]
        assert 0 < cut.prompt_tokens < 1024 - MAX_OUTPUT_TOKENS, cut

        # a spoken turn after the cut: its prompt starts as the last one did, so the cached prefix holds
        await call.microphone.speak(np.concatenate([silence(0.3), speech, silence(AFTER_SPEECH_S)]))
        await _until(lambda: len(call.seen.usage) == 3)
        spoken = call.seen.usage[2]
        assert spoken.prompt_tokens > cut.prompt_tokens and (spoken.cache_read_input_tokens or 0) >= \
            cut.prompt_tokens // 2, call.seen.usage

        # the first note left the prompt, not the conversation
        first_note = next(i["id"] for i in call.items if i["role"] == "system")
        retrieved = await asyncio.wait_for(call.llm.retrieve_conversation_item(first_note), 10)
        assert retrieved.content is not None and retrieved.content[0].text == NOTES[notes][0]

        # every reply kept to Pipecat's max_output_tokens (its usage counts text and audio together)
        assert all(u.completion_tokens - (u.output_audio_tokens or 0) <= MAX_OUTPUT_TOKENS
                   for u in call.seen.usage), call.seen.usage
        await asyncio.sleep(0.5)
        assert call.seen.errors == []
    assert session_errors(server, log_from) == []
