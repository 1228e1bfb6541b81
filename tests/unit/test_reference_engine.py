"""The baseline engine (backend: transformers_generate) on the tiny checkpoint: the library's
generate(return_audio=True) behind the Engine protocol, one request at a time, nothing streamed early."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engine import (
    AudioChunk,
    Engine,
    EngineError,
    EngineRequest,
    Failed,
    Finished,
    Message,
    ProfileError,
    SamplingParams,
    TextDelta,
    TextPart,
    create_engine,
    load_profile,
)
from engine.omni.reference import ReferenceCore

REPO = Path(__file__).resolve().parents[2]
MAX_FRAMES = 6


@pytest.fixture(scope="module")
def engine(tiny_checkpoint: Path, cache_dir: Path) -> Engine:
    profile = load_profile(model="tiny", platform="cpu", overrides={"backend": "transformers_generate"},
                           stage_overrides={"thinker": {"ignore_eos": True},
                                            "talker": {"max_frames": MAX_FRAMES, "ignore_eos": True}})
    engine = create_engine("tiny", profile, cache_dir)
    assert isinstance(engine.core.core, ReferenceCore)  # type: ignore[attr-defined]
    return engine


def _request(rid: str, text: str = "hello there", **kw) -> EngineRequest:
    sampling = SamplingParams(max_tokens=kw.pop("max_tokens", 5), seed=kw.pop("seed", 0))
    return EngineRequest(rid, (Message("user", (TextPart(text),)),), sampling=sampling, **kw)


async def _events(engine: Engine, request: EngineRequest) -> list:
    return [event async for event in await engine.submit(request)]


async def test_reply_arrives_whole_when_generate_returns(engine: Engine) -> None:
    await engine.start()
    try:
        events = await _events(engine, _request("r1"))
        assert [type(e) for e in events] == [TextDelta, AudioChunk, Finished]
        text, audio, done = events
        assert len(text.token_ids) == 5 and text.text
        # generate() decodes all MAX_FRAMES frames in one Code2Wav call, which drops a causal tail < 1 frame
        frame = engine.info.codec_frame_samples
        assert (MAX_FRAMES - 1) * frame < audio.samples.size <= MAX_FRAMES * frame
        assert audio.sample_offset == 0 and audio.is_last
        t = done.timings
        assert done.finish_reason == "length"  # EOS ignored: fixed length, as the benchmark workload wants
        assert (t.completion_tokens, t.codec_frames, t.audio_samples) == (5, MAX_FRAMES, audio.samples.size)
        assert t.ttft_s == t.ttfp_s == t.total_s > 0  # nothing streams early

        # same seed, same reply; text only skips the talker
        again = await _events(engine, _request("r2"))
        assert again[0].token_ids == text.token_ids
        text_only = await _events(engine, _request("r3", want_audio=False))
        assert [type(e) for e in text_only] == [TextDelta, Finished]
        assert text_only[-1].timings.ttfp_s is None and text_only[-1].timings.codec_frames == 0
        assert engine.num_active_requests() == 0 and engine.stage_load() == {"generate": 0}
    finally:
        await engine.stop()


def _count(engine: Engine, outcome: str) -> float:
    return engine.registry.get_sample_value("engine_requests_total", {"outcome": outcome}) or 0.0


async def test_abort_while_waiting_skips_the_request(engine: Engine) -> None:
    await engine.start()
    completed, aborted = _count(engine, "completed"), _count(engine, "aborted")
    try:
        first = await engine.submit(_request("a1"))
        second = await engine.submit(_request("a2"))
        assert engine.stage_load() == {"generate": 2}
        engine.abort("a2")
        engine.abort("a2")  # twice is fine
        assert [type(e) for e in [e async for e in second]] == [Failed]
        assert [type(e) for e in [e async for e in first]] == [TextDelta, AudioChunk, Finished]
        # a closed stream aborts its request; the worker then finds nothing left to run
        third = await engine.submit(_request("a3"))
        await third.aclose()
        await asyncio.sleep(0.1)
        assert engine.num_active_requests() == 0
        assert (_count(engine, "completed") - completed, _count(engine, "aborted") - aborted) == (1, 2)
    finally:
        await engine.stop()


async def test_bad_requests_are_refused_like_the_staged_engine(engine: Engine) -> None:
    await engine.start()
    try:
        with pytest.raises(EngineError, match="unknown voice"):
            await engine.submit(_request("b1", speaker="nobody"))
        with pytest.raises(EngineError, match="exceeds this model's context") as info:
            await engine.submit(_request("b2", max_tokens=engine.info.max_model_len))
        assert info.value.code == "context_length_exceeded"
        with pytest.raises(EngineError, match="at least 1"):
            await engine.submit(_request("b3", max_tokens=0))
        assert engine.num_active_requests() == 0
    finally:
        await engine.stop()


def test_profile_selects_the_backend(tmp_path: Path) -> None:
    assert load_profile(REPO / "configs/tiny.yaml", platform="cpu").backend == "omni"
    baseline = load_profile(REPO / "configs/qwen3_omni_moe.yaml", platform="cuda",
                            overrides={"backend": "transformers_generate",
                                       "engine": {"where": "in_process", "http_workers": 1}})
    assert baseline.backend == "transformers_generate" and baseline.runs_in_process
    with pytest.raises(ProfileError, match="engine.where: the transformers_generate baseline runs in_process"):
        load_profile(REPO / "configs/qwen3_omni_moe.yaml", platform="cuda",
                     overrides={"backend": "transformers_generate"})
    bad = tmp_path / "bad.yaml"
    bad.write_text("backend: vllm\n")
    with pytest.raises(ProfileError, match="backend: must be one of omni, transformers_generate"):
        load_profile(bad, platform="cpu")
