"""`voice-gateway serve assistant` on loopback, driven as clients drive it: a spoken question streamed at real-time pace
into a realtime session whose default turn detection ends the turn and answers in audio that Whisper hears as its
transcript; a seeded chat reply streamed equals the same reply in one piece, text and audio; LiveKit Agents' and Pipecat's own
OpenAI realtime clients ask the question aloud and get English words back."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import time
from pathlib import Path

import aiohttp
import numpy as np
import openai
import pytest
import soundfile as sf
from livekit.agents import llm
from livekit.plugins.openai.realtime import RealtimeModel
from pipecat.frames.frames import (
    LLMFullResponseEndFrame,
    LLMRunFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameProcessor
from pipecat.services.openai.realtime.events import (
    AudioConfiguration,
    AudioInput,
    InputAudioTranscription,
    SessionProperties,
)
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

from engine.cascade.ears import WhisperEars
from tests.conftest import Server
from tests.integration.test_assistant_server import assistant_server, question_wav, words  # noqa: F401 (fixtures)
from tests.integration.test_chat_api import _delta_audio
from tests.integration.test_livekit_agents import heard, push_speech
from tests.integration.test_pipecat import Microphone, Seen, Speaker, end_pipeline
from tests.integration.test_realtime import RATE, append_audio, client_for, events_until, first, silence
from tests.unit.test_assistant import edits
from voice_gateway.audio.resample import resample

# the frameworks' clients keep tasks on the loop they were made on: the tests share one loop, as theirs do
pytestmark = pytest.mark.asyncio(loop_scope="session")
# The silence after the question for the frameworks' sessions: their default semantic_vad's clock is the audio, so a
# turn it holds open ends only once this much silence has arrived (its longest wait is 4 s at eagerness auto).
AFTER_SPEECH_S = 4.5
_LIVE_CHUNK_S = 0.02  # a microphone's 20 ms frames
# Words a reply must hold to count as an answer: an unseeded reply to the question can be as short as "Paris, France"
ENOUGH_WORDS = 2


@pytest.fixture(scope="module")
def question(question_wav: Path) -> np.ndarray:  # noqa: F811
    """The spoken question, float32 at 24 kHz."""
    samples, rate = sf.read(question_wav, dtype="float32")
    return resample(samples, rate, RATE)


@pytest.fixture(scope="module")
def ears() -> WhisperEars:
    """The server's own ears, in this process: they hear the replies' audio back."""
    return WhisperEars.from_package(cpu_threads=1, workers=1)


def alphabetic(text: str) -> list[str]:
    """The words of `text` made of letters (an apostrophe inside one too: "it's", "L'Alma")."""
    return [w for w in words(text) if w.replace("'", "").isalpha()]


async def append_live(conn, samples: np.ndarray) -> None:
    """`samples` in 20 ms appends, each sent when a microphone would have captured it."""
    step = int(_LIVE_CHUNK_S * RATE)
    started = time.monotonic()
    for n, i in enumerate(range(0, samples.size, step)):
        await asyncio.sleep(max(0.0, started + n * _LIVE_CHUNK_S - time.monotonic()))
        await append_audio(conn, samples[i : i + step], chunk_s=_LIVE_CHUNK_S)


async def answered_turn(conn, samples: np.ndarray) -> list:
    """Speaks `samples` live; the events up to the turn's response.done and its input transcription."""
    await append_live(conn, samples)
    events = await events_until(conn, "response.done", timeout_s=120)
    if not any(e.type == "conversation.item.input_audio_transcription.completed" for e in events):
        events += await events_until(conn, "conversation.item.input_audio_transcription.completed")  # after the reply
    return events


def reply_of(events: list) -> tuple[str, np.ndarray]:
    """A turn's reply: its transcript and its audio, float32 at 24 kHz."""
    done = next(e for e in events if e.type == "response.done").response
    assert done.status == "completed", done
    pcm = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    return done.output[0].content[0].transcript, np.frombuffer(pcm, "<i2").astype(np.float32) / 32768


async def test_the_default_turn_detection_ends_spoken_questions_and_the_replies_are_heard_as_their_transcripts(
        assistant_server: Server, question: np.ndarray, tmp_path: Path, ears: WhisperEars) -> None:  # noqa: F811
    """No commit and no response.create from the client: the assistant's default, semantic_vad with the words of each
    pause, finds each question's speech and its end, and the turn is committed and answered. The replies' audio speaks their transcripts: Whisper hears them
    with a word error of at most 25 % over both. Over both, as in tests/unit/test_assistant.py: the reply to the
    first, "The capital of France is Paris.", is always heard as "... Francis Paris." (2 edits in 6 words). At
    temperature 0: sampled (0.6 or 0.8), the 135M model begins about half its answers to it in French ("La femme de
    France, ..."), which tiny.en cannot hear, and the history then draws the second reply into French too."""
    sea = tmp_path / "sea.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(sea), "Tell me about the sea."], check=True)
    samples, rate = sf.read(sea, dtype="float32")
    async with client_for(assistant_server) as client, client.realtime.connect(model="assistant") as conn:
        assert (await conn.recv()).type == "session.created"
        # temperature: the beta API's, which GA dropped and this server still honours
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 80, "temperature": 0.0,
                                           "audio": {"input": {"transcription": {"model": "whisper-1"}}}})
        updated = (await events_until(conn, "session.updated"))[-1].session
        assert updated.audio.input.turn_detection.type == "semantic_vad", updated.audio.input.turn_detection
        capital = await answered_turn(conn, np.concatenate([silence(0.5), question, silence(AFTER_SPEECH_S)]))
        about_sea = await answered_turn(conn, np.concatenate([resample(samples, rate, RATE), silence(AFTER_SPEECH_S)]))

    for events in (capital, about_sea):
        order = [first(events, kind) for kind in (
            "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
            "response.created", "response.output_audio.delta", "response.done")]
        assert order == sorted(order), [e.type for e in events]
        started, stopped = events[order[0]], events[order[1]]
        assert started.audio_start_ms < stopped.audio_end_ms, (started, stopped)
    [heard_capital] = [e for e in capital if e.type == "conversation.item.input_audio_transcription.completed"]
    assert {"capital", "france"} <= set(words(heard_capital.transcript)), heard_capital.transcript
    [heard_sea] = [e for e in about_sea if e.type == "conversation.item.input_audio_transcription.completed"]
    assert "sea" in words(heard_sea.transcript), heard_sea.transcript

    said, audio = reply_of(capital)
    assert len(alphabetic(said)) >= ENOUGH_WORDS, said
    said_sea, audio_sea = reply_of(about_sea)
    heard_back = ears.transcribe_many([resample(a, RATE, 16_000) for a in (audio, audio_sea)])
    (e1, n1), (e2, n2) = edits(said, heard_back[0]), edits(said_sea, heard_back[1])
    assert (e1 + e2) / (n1 + n2) <= 0.25, (said, said_sea, heard_back)


async def test_a_streamed_chat_reply_equals_the_one_shot_reply(assistant_server: Server) -> None:  # noqa: F811
    """The same seed, the same words and the same samples, whether the reply is streamed as SSE deltas or sent
    whole: the sampler and the voice's noise are drawn from the seed alone. pcm16 both ways, so the bytes match."""
    ask = {"model": "assistant", "messages": [{"role": "user", "content": "What is the capital of France?"}],
           "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"}, "seed": 7,
           "max_completion_tokens": 60}
    async with openai.AsyncOpenAI(base_url=assistant_server.base_url + "/v1", api_key="unused",
                                  max_retries=0) as client:
        transcript, pieces, finish_reasons = "", [], []
        async for chunk in await client.chat.completions.create(**ask, stream=True):
            if not chunk.choices:
                continue
            audio = _delta_audio(chunk.choices[0].delta)
            pieces.append(base64.b64decode(audio.get("data", "")))
            transcript += audio.get("transcript", "")
            if chunk.choices[0].finish_reason:
                finish_reasons.append(chunk.choices[0].finish_reason)
        whole = await client.chat.completions.create(**ask)
    streamed = b"".join(pieces)
    assert len(finish_reasons) == 1 and len(alphabetic(transcript)) >= ENOUGH_WORDS, transcript
    assert whole.choices[0].finish_reason == finish_reasons[0]
    assert whole.choices[0].message.audio is not None
    assert whole.choices[0].message.audio.transcript == transcript
    one_shot = base64.b64decode(whole.choices[0].message.audio.data)
    assert len(streamed) / 2 / RATE > 0.5
    assert one_shot == streamed, (len(one_shot), len(streamed))


@pytest.mark.frameworks
async def test_a_livekit_realtime_session_answers_a_spoken_question(
        assistant_server: Server, question: np.ndarray) -> None:  # noqa: F811
    """LiveKit's OpenAI realtime client at its defaults (semantic_vad, input transcription on): its turn detection
    ends the spoken question, the reply that follows is English words in audio, and the user's transcript is the
    question's."""
    errors: list = []
    transcripts: asyncio.Queue[llm.InputTranscriptionCompleted] = asyncio.Queue()
    generations: asyncio.Queue[llm.GenerationCreatedEvent] = asyncio.Queue()
    async with aiohttp.ClientSession() as http:
        model = RealtimeModel(model="assistant", base_url=assistant_server.base_url + "/v1", api_key="unused",
                              http_session=http)
        session = model.session()
        session.on("error", errors.append)
        session.on("generation_created", generations.put_nowait)

        @session.on("input_audio_transcription_completed")
        def _transcribed(event: llm.InputTranscriptionCompleted) -> None:
            if event.is_final:
                transcripts.put_nowait(event)

        try:
            await push_speech(session, np.concatenate([silence(0.3), question, silence(AFTER_SPEECH_S)]))
            spoken = await asyncio.wait_for(generations.get(), 120)
            text, frames = await asyncio.wait_for(heard(spoken), 120)
            transcript = await asyncio.wait_for(transcripts.get(), 30)
        finally:
            await session.aclose()
            await model.aclose()
    assert not spoken.user_initiated  # the server's turn detection made it
    assert frames > 0 and len(alphabetic(text)) >= ENOUGH_WORDS, text
    assert {"capital", "france"} <= set(words(transcript.transcript)), transcript.transcript
    assert errors == []


class Replies(BaseObserver):
    """What the realtime service tells its pipeline: the user's transcripts, and each reply's words and audio frames
    once it has ended (LLMFullResponseEndFrame), in order."""

    def __init__(self, service: FrameProcessor) -> None:
        super().__init__()
        self.service = service
        self.transcripts: list[str] = []
        self.replies: list[tuple[str, int]] = []
        self._words, self._frames = "", 0

    async def on_push_frame(self, data: FramePushed) -> None:
        if data.source is not self.service:  # every frame is seen once per hop: count each where it starts
            return
        if isinstance(data.frame, TranscriptionFrame):
            self.transcripts.append(data.frame.text)
        elif isinstance(data.frame, TTSTextFrame):
            self._words += data.frame.text
        elif isinstance(data.frame, TTSAudioRawFrame):
            self._frames += 1
        elif isinstance(data.frame, LLMFullResponseEndFrame):
            self.replies.append((self._words, self._frames))
            self._words, self._frames = "", 0


@pytest.mark.frameworks
async def test_a_pipecat_pipeline_answers_a_spoken_question(assistant_server: Server,  # noqa: F811
                                                            question: np.ndarray) -> None:
    """Pipecat's OpenAI realtime service with input transcription on, in a pipeline whose source and sink are ours:
    after the context's greeting, the spoken question is answered in English words with audio, and the user's
    transcript is the question's."""
    service = OpenAIRealtimeLLMService(
        api_key="unused", base_url=assistant_server.base_url.replace("http://", "ws://") + "/v1/realtime",
        settings=OpenAIRealtimeLLMService.Settings(model="assistant", session_properties=SessionProperties(
            audio=AudioConfiguration(input=AudioInput(transcription=InputAudioTranscription())))))
    context = LLMContext([{"role": "developer", "content": "Say hello!"}])
    user, assistant = LLMContextAggregatorPair(context)
    microphone, speaker, seen, replies = Microphone(), Speaker(), Seen(), Replies(service)
    worker = PipelineWorker(Pipeline([microphone, user, service, speaker, assistant]), params=PipelineParams(),
                            observers=[seen, replies], idle_timeout_secs=None, enable_rtvi=False)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    try:
        # the greeting: the session is set up (transcription on) before anything is spoken
        await microphone.queue_frame(LLMRunFrame())
        async with asyncio.timeout(120):
            while not replies.replies:
                await asyncio.sleep(0.05)
        await microphone.speak(np.concatenate([silence(0.3), question, silence(AFTER_SPEECH_S)]))
        async with asyncio.timeout(120):
            while len(replies.replies) < 2 or not replies.transcripts:
                await asyncio.sleep(0.05)
    finally:
        await end_pipeline(worker, running)
    (_, greeting_frames), (answer, answer_frames) = replies.replies[:2]
    assert greeting_frames > 0 and answer_frames > 0, replies.replies
    assert len(alphabetic(answer)) >= ENOUGH_WORDS, replies.replies
    assert {"capital", "france"} <= set(words(replies.transcripts[0])), replies.transcripts
    assert speaker.audio_frames >= greeting_frames + answer_frames  # the audio went on down the pipeline
    assert seen.errors == []
