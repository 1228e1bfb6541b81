"""Code2Wav's step (engine/omni/stages/code2wav.py) on the tiny decoder: ready chunks by playback deadline, first
chunks first, then the replies whose listeners hold the least audio, and no more per step than
`max_step_frames` (the padded batch) allows, never fewer than one chunk."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.handoff import CodecFrames, Inbox
from engine.metrics import EngineMetrics
from engine.omni.runners.code2wav import StreamingCode2Wav
from engine.omni.stages.code2wav import Code2WavStage, PlaybackClock
from engine.omni.weights.checkpoint import load_stage
from engine.profile import ChunkConfig, Code2WavConfig

CHUNKS = ChunkConfig(enabled=True, initial_chunk_frames=4, chunk_frames=8)


@pytest.fixture(scope="module")
def decoder_model(tiny_checkpoint: Path) -> object:
    return load_stage(tiny_checkpoint, "code2wav", device="cpu", dtype="float32").model


def stage_of(model: object, **cfg: int) -> tuple[Code2WavStage, PlaybackClock]:
    clock = PlaybackClock()
    stage = Code2WavStage(StreamingCode2Wav(model, 8), Code2WavConfig(**cfg), CHUNKS, clock, Inbox(),
                          lambda _: None, EngineMetrics())
    return stage, clock


def frames(stage: Code2WavStage, request_id: str, n: int) -> None:
    gen = torch.Generator().manual_seed(len(request_id) + n)
    codes = torch.randint(0, 64, (stage.decoder.num_quantizers, n), generator=gen)
    stage.accept(CodecFrames(request_id, codes, is_final=False))


def test_first_chunks_go_first_then_the_least_buffered(decoder_model: object) -> None:
    stage, clock = stage_of(decoder_model, max_batch=3)
    with torch.inference_mode():
        for rid in ("rich", "poor"):
            frames(stage, rid, 4)
        assert sorted(stage.step()) == ["poor", "rich"]  # both first chunks, one step
        clock.emitted("rich", 5.0)  # its listener holds seconds, the other's a fraction of one
        for rid in ("rich", "poor"):
            frames(stage, rid, 8)
        frames(stage, "new", 4)
        frames(stage, "newer", 4)
        assert stage.step() == ["new", "newer", "poor"]  # max_batch 3: the well-stocked listener waits
        assert stage.step() == ["rich"]


def test_a_step_holds_no_more_than_its_frames(decoder_model: object) -> None:
    stage, _ = stage_of(decoder_model, max_batch=8, max_step_frames=16)
    with torch.inference_mode():
        for rid in ("a", "b", "c", "d", "e"):
            frames(stage, rid, 4)
        assert stage.step() == ["a", "b", "c", "d"]  # 4 chunks of 4 frames
        assert stage.step() == ["e"]
        for rid in ("a", "b", "c"):
            frames(stage, rid, 8)
        assert len(stage.step()) == 2  # 2 x 8 frames
        tight, _ = stage_of(decoder_model, max_batch=8, max_step_frames=1)
        frames(tight, "alone", 4)
        assert tight.step() == ["alone"]  # a chunk wider than the cap still goes, alone


def test_every_step_takes_a_shape_the_decoder_warmed(decoder_model: object) -> None:
    """Under random chunk sizes and arrivals, each step's padded (rows, frames) is one of `step_shapes()`:
    the shapes beyond `max_step_frames` that start-up no longer warms or captures never occur."""
    decoder = StreamingCode2Wav(decoder_model, 32, batch_buckets=(1, 2, 4, 8), frame_buckets=(4, 6, 8),
                                max_step_frames=20)
    shapes = set(decoder.step_shapes())
    assert (4, 8) not in shapes and (2, 8) in shapes  # 3 rows of 7 or 8 frames hold more than 20: never
    stage = Code2WavStage(decoder, Code2WavConfig(max_batch=8, max_step_frames=20),
                          ChunkConfig(enabled=True, initial_chunk_frames=4, ramp_frames=(6,), chunk_frames=8),
                          PlaybackClock(), Inbox(), lambda _: None, EngineMetrics())
    taken: list[tuple[int, int]] = []
    decode = decoder._decode
    decoder._decode = lambda batch: (taken.append(tuple(batch.codes.shape[::2])), decode(batch))[1]  # type: ignore[method-assign]
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for step in range(40):
            for rid in range(int(torch.randint(0, 4, (1,), generator=gen))):
                n = int(torch.randint(1, 9, (1,), generator=gen))
                codes = torch.randint(0, 64, (decoder.num_quantizers, n), generator=gen)
                stage.accept(CodecFrames(f"r{(step * 4 + rid) % 12}", codes, is_final=False))
            stage.step()
    assert len(taken) > 20 and set(taken) <= shapes, set(taken) - shapes
