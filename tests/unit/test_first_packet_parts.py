"""A spoken reply's first packet split by the part each stage took (engine/api.py `FirstPacketParts`), on the tiny
engine: every part is there, none is negative, and they add up to the engine's own first packet; the server's
/metrics carries each part's histogram, which the bench reads window by window."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from pathlib import Path

from engine import (
    EngineRequest,
    Finished,
    FirstPacketParts,
    Message,
    SamplingParams,
    TextPart,
    create_engine,
    load_profile,
)


def _spoken(rid: str, question: str) -> EngineRequest:
    return EngineRequest(rid, (Message("user", (TextPart(question),)),), want_audio=True,
                         sampling=SamplingParams(max_tokens=6, seed=0))


def test_the_parts_add_up_to_the_first_packet(tiny_checkpoint: Path, cache_dir: Path) -> None:
    async def run() -> list[Finished]:
        engine = create_engine("tiny", load_profile(model="tiny", platform="cpu"), cache_dir)
        await engine.start()
        try:
            ends = []
            for rid, question in (("a", "Tell me about the sea."), ("b", "And the mountains?")):
                events = [event async for event in await engine.submit(_spoken(rid, question))]
                assert isinstance(events[-1], Finished), events[-1]
                ends.append(events[-1])
            parts = {s.labels["part"]: s.value for m in engine.registry.collect() for s in m.samples
                     if s.name == "engine_first_packet_part_seconds_count"}
            assert parts == {p: 2.0 for p in ("queued", "thinker", "talker_prefill", "talker_frames", "code2wav")}
            return ends
        finally:
            await engine.stop()

    for finished in asyncio.run(run()):
        timings = finished.timings
        assert isinstance(timings.first_packet, FirstPacketParts) and timings.ttfp_s is not None
        assert all(seconds >= 0 for seconds in asdict(timings.first_packet).values()), timings.first_packet
        assert abs(timings.first_packet.total_s - timings.ttfp_s) < 1e-6, timings
        # the Thinker's prefill and Code2Wav's first chunk are work on every reply: neither is left at 0
        assert timings.first_packet.thinker_s > 0 and timings.first_packet.code2wav_s > 0
