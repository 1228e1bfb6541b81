"""128 replies at once (the tiny model on the CPU): admission lets 128 run, the Thinker's 128 slots share a KV
pool of a quarter of 128 x max_model_len, the Talker's a pool of 64 pages (each reply reserves one, so the gate
holds half of them back until the others give their pages back), and every reply finishes with its text and speech; replies after them take
the pages the first gave back, and every page is back in the end."""

from __future__ import annotations

import asyncio
from pathlib import Path

from engine import (
    AudioChunk,
    EngineRequest,
    Failed,
    Finished,
    Message,
    SamplingParams,
    TextDelta,
    TextPart,
    create_engine,
)
from engine.omni.runners.kv_cache import PAGE_SIZE
from engine.profile import load_profile

REPLIES = 128
TALKER_PAGES = 64
GREEDY = {"temperature": 0}


def _engine(cache_dir: Path):
    on = {"device": "cpu", "max_batch": REPLIES}
    profile = load_profile(model="tiny", platform="cpu", overrides={"admission": {"max_queued": 2 * REPLIES,
                                                                                "queue_timeout_s": 120}},
                           stage_overrides={
                               "thinker": {**on, "max_model_len": 512, "kv_cache_tokens": REPLIES * 512 // 4,
                                           "max_step_tokens": 2048},
                               "talker": {**on, "max_frames": 4, "kv_cache_tokens": TALKER_PAGES * PAGE_SIZE,
                                          "sampling": GREEDY, "code_sampling": GREEDY},
                               "code2wav": on})
    return create_engine("tiny", profile, cache_dir)


async def _reply(engine, rid: str) -> tuple[int, int, Finished | Failed | None]:
    stream = await engine.submit(EngineRequest(rid, (Message("user", (TextPart(f"Question number {rid}?"),)),), True,
                                               "ethan", SamplingParams(max_tokens=3, temperature=0)))
    tokens = samples = 0
    finished = None
    async for event in stream:
        if isinstance(event, TextDelta):
            tokens += len(event.token_ids)
        elif isinstance(event, AudioChunk):
            samples += event.samples.size
        elif isinstance(event, Finished | Failed):
            finished = event
    return tokens, samples, finished


def test_128_replies_at_once_share_the_kv_pool(cache_dir: Path) -> None:
    async def run():
        engine = _engine(cache_dir)
        await engine.start()
        try:
            first = await asyncio.gather(*(_reply(engine, f"a{i}") for i in range(REPLIES)))
            second = await asyncio.gather(*(_reply(engine, f"b{i}") for i in range(16)))
            return first, second, engine.registry.get_sample_value("engine_talker_kv_pages", {"holder": "free"})
        finally:
            await engine.stop()

    first, second, talker_free = asyncio.run(run())
    assert talker_free == TALKER_PAGES  # the prompts are too short to keep: every page back
    assert len(first) == REPLIES
    for tokens, samples, finished in (*first, *second):
        assert isinstance(finished, Finished), finished
        assert tokens == 3 and samples > 0
