"""The assistant cascade end to end, in process (engine/cascade/): a spoken question is heard, answered with
meaning and spoken back in words that Whisper hears again; a seeded reply is the same twice; abort frees it."""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr

from engine import (
    AudioChunk,
    AudioPart,
    Engine,
    EngineRequest,
    Failed,
    Finished,
    Message,
    SamplingParams,
    TextDelta,
    create_engine,
    load_profile,
)
from engine.cascade.ears import WhisperEars

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow]


def spoken(text: str, tmp_path: Path) -> np.ndarray:
    wav = tmp_path / "question.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(wav), text], check=True)
    audio, rate = sf.read(wav, dtype="float32")
    return soxr.resample(audio, rate, 16_000).astype(np.float32)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def edits(reference: str, heard: str) -> tuple[int, int]:
    """(word edits from `reference` to `heard`, words in `reference`)."""
    ref, hyp = words(reference), words(heard)
    d = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, d[0] = d[0], i
        for j, h in enumerate(hyp, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (r != h))
    return d[-1], len(ref)


@pytest.fixture(scope="module")
async def assistant(cache_dir: Path) -> AsyncIterator[Engine]:
    engine = create_engine("assistant", load_profile(model="assistant", platform="cpu"), cache_dir)
    await engine.start()
    yield engine
    await engine.stop()


async def reply(engine: Engine, request_id: str, audio: np.ndarray, seed: int) -> tuple[str, np.ndarray, Finished]:
    request = EngineRequest(request_id, (Message("user", (AudioPart(audio),)),), want_audio=True, speaker="joe",
                            sampling=SamplingParams(seed=seed))
    events = [event async for event in await engine.submit(request)]
    assert isinstance(events[-1], Finished), events[-1]
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    return text, np.concatenate([e.samples for e in events if isinstance(e, AudioChunk)]), events[-1]


async def test_spoken_questions_get_spoken_answers_with_meaning(assistant: Engine, tmp_path: Path) -> None:
    """The answer means something, and its audio is words: Whisper hears the reply's text in it again, with a word
    error of at most 25 % over the replies (a voice's "France is" heard as "Francis" is one sentence's third)."""
    assert assistant.info.model_id == "assistant" and not assistant.info.is_random_weights
    ears = WhisperEars.from_package(cpu_threads=1, workers=1)
    question = spoken("What is the capital of France?", tmp_path)
    text, audio, done = await reply(assistant, "capital", question, seed=3)
    assert "paris" in words(text), text
    assert done.timings.ttfp_s is not None and audio.size / 24_000 > 0.5
    errors, total = edits(text, ears.transcribe(soxr.resample(audio, 24_000, 16_000)))
    for n, ask in enumerate(["What colour is the sky on a clear day?", "Name a fruit that is yellow.",
                             "What do bees make?"]):
        said, speech, _ = await reply(assistant, f"q{n}", spoken(ask, tmp_path), seed=n)
        e, t = edits(said, ears.transcribe(soxr.resample(speech, 24_000, 16_000)))
        errors, total = errors + e, total + t
    assert errors / total <= 0.25, (errors, total)

    again, audio_again, _ = await reply(assistant, "capital-again", question, seed=3)
    assert again == text and np.array_equal(audio_again, audio)  # the seed fixes the words and the voice


async def test_an_aborted_reply_leaves_nothing_behind(assistant: Engine, tmp_path: Path) -> None:
    question = spoken("Tell me a long story about a dragon and a knight.", tmp_path)
    request = EngineRequest("story", (Message("user", (AudioPart(question),)),), want_audio=True, speaker="joe",
                            sampling=SamplingParams(max_tokens=200))
    stream = await assistant.submit(request)
    async for event in stream:
        if isinstance(event, AudioChunk) and event.samples.size:
            break
    await stream.aclose()
    async with asyncio.timeout(30):
        while assistant.num_active_requests() or any(assistant.stage_load().values()):
            await asyncio.sleep(0.05)
    events = [e async for e in await assistant.submit(EngineRequest(
        "after", (Message("user", (AudioPart(question),)),), want_audio=False, sampling=SamplingParams(max_tokens=4)))]
    assert not isinstance(events[-1], Failed), events[-1]
