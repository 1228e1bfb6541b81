"""Code2Wav holding back replies far ahead of real time while another waits for its first packet
(`first_packet.defer_ahead_s`): who is decoded when, and that the audio stays the same."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from engine import AudioChunk, EngineRequest, Message, SamplingParams, TextPart, create_engine
from engine.handoff import CodecFrames, Inbox
from engine.metrics import EngineMetrics
from engine.profile import ChunkConfig, Code2WavConfig, FirstPacketConfig, load_profile
from engine.runners.code2wav import StreamingCode2Wav
from engine.stages.code2wav import Code2WavStage
from engine.stages.policy import FirstPacketPolicy
from engine.weights.checkpoint import load_stage


@pytest.fixture(scope="module")
def model(tiny_checkpoint: Path) -> torch.nn.Module:
    return load_stage(tiny_checkpoint, "code2wav", device="cpu", dtype="float32").model


def _stage(model: torch.nn.Module, defer_ahead_s: float) -> tuple[Code2WavStage, list, FirstPacketPolicy]:
    reports: list = []
    # a first chunk of 25 frames is 2 s of audio: far ahead of real time for the whole test
    chunks = ChunkConfig(initial_chunk_frames=25)
    policy = FirstPacketPolicy(FirstPacketConfig(defer_ahead_s=defer_ahead_s), chunks)
    with torch.inference_mode():
        decoder = StreamingCode2Wav(model, 4)
    stage = Code2WavStage(decoder, Code2WavConfig(), chunks, policy, Inbox(), reports.append, EngineMetrics())
    return stage, reports, policy


def _frames(seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (16, 25), generator=torch.Generator().manual_seed(seed))


def _step(stage: Code2WavStage) -> list[str]:
    with torch.inference_mode():
        return stage.step()


@pytest.mark.parametrize("defer_ahead_s", [0.5, 0.0])
def test_a_reply_far_ahead_waits_while_another_waits_for_its_first_packet(model, defer_ahead_s: float) -> None:
    stage, reports, policy = _stage(model, defer_ahead_s)
    stage.accept(CodecFrames("ahead", _frames(1), is_final=False))
    assert _step(stage) == ["ahead"]
    stage.accept(CodecFrames("ahead", _frames(2), is_final=False))
    policy.admitted("new")  # what the orchestrator tells it
    if not defer_ahead_s:  # off: nothing waits
        assert stage.has_work() and _step(stage) == ["ahead"]
        return
    assert not stage.has_work()
    stage.accept(CodecFrames("new", _frames(3), is_final=False))
    assert stage.has_work() and _step(stage) == ["new"]  # the first packet goes alone
    policy.first_audio("new")
    assert stage.has_work() and _step(stage) == ["ahead"]
    assert [r.request_id for r in reports] == ["ahead", "new", "ahead"]


async def _replies(engine, n: int) -> list[np.ndarray]:
    async def one(i: int) -> np.ndarray:
        await asyncio.sleep(0.3 * i)  # later arrivals meet earlier replies already ahead of real time
        request = EngineRequest(f"r{i}", (Message("user", (TextPart(f"story number {i}"),)),), True, "ethan",
                                SamplingParams(max_tokens=12, seed=i))
        samples = [e.samples async for e in await engine.submit(request) if isinstance(e, AudioChunk)]
        return np.concatenate(samples)

    return await asyncio.gather(*(one(i) for i in range(n)))


def _audio(cache_dir: Path, defer_ahead_s: float) -> tuple[list[np.ndarray], int]:
    overrides = {"first_packet": {"defer_ahead_s": defer_ahead_s}}
    engine = create_engine("tiny", load_profile(model="tiny", platform="cpu", overrides=overrides), cache_dir)

    async def go():
        await engine.start()
        try:
            audio = await asyncio.wait_for(_replies(engine, 3), timeout=180)
            return audio, len(engine.core.core.policy.awaiting)
        finally:
            await engine.stop()

    return asyncio.run(go())


def test_deferring_changes_no_sample_and_forgets_every_reply(cache_dir: Path) -> None:
    """Through the engine: the orchestrator's set of replies awaiting audio empties as they finish. (The
    tiny CPU engine runs behind real time, so nothing is far enough ahead to wait here; the test above
    checks who waits.)"""
    plain, _ = _audio(cache_dir, 0.0)
    deferred, still_awaiting = _audio(cache_dir, 0.01)
    assert still_awaiting == 0
    assert all(len(a) for a in plain)
    for a, b in zip(plain, deferred):  # the same codes; only which replies share a batch may differ
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
