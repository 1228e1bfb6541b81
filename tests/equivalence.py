"""The Omni engine against transformers' own Qwen3-Omni pipeline: what the CPU tests and the GPU lane share.

Reference: `Qwen3OmniMoeForConditionalGeneration.generate(return_audio=True)` on the
same tiny checkpoint, greedy everywhere. Two requests of different lengths run
concurrently in the engine, so their Talker and Code2Wav forwards are shared.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import numpy as np
import torch

from engine import AudioChunk, EngineRequest, Finished, Message, SamplingParams, TextDelta, TextPart, create_engine
from engine.profile import load_profile

TEXT_TOKENS = 6
FRAMES = 10
SAMPLES_PER_FRAME = 1920  # 24 kHz, 12.5 frames a second
PROMPTS = ["Hello there", "Please describe, in a few careful words, the colour of the evening sea."]


async def _run_engine(
    cache_dir: Path, device: str, code2wav: dict, top: dict, copies: int
) -> list[tuple[list[int], list[int], list[np.ndarray], Finished]]:
    """`top`: profile keys outside the stages (kernels, cuda_graphs, first_packet)."""
    greedy = {"temperature": 0}
    on = {"device": device}
    ramp = code2wav.pop("ramp_frames", None)  # a chunk schedule, not a Code2Wav setting
    profile = load_profile(
        model="tiny",
        platform="cpu",
        stage_overrides={
            "thinker": on,
            "talker": {**on, "max_frames": FRAMES, "sampling": greedy, "code_sampling": greedy, "copies": copies},
            "code2wav": {"device": device, "copies": copies, **code2wav},
        },
        overrides=top,
    )
    if ramp:
        profile = dataclasses.replace(profile, async_chunk=dataclasses.replace(profile.async_chunk, ramp_frames=ramp))
    engine = create_engine("tiny", profile, cache_dir)
    await engine.start()

    async def one(i: int, prompt: str):
        request = EngineRequest(
            f"r{i}", (Message("user", (TextPart(prompt),)),), True, "ethan", SamplingParams(max_tokens=TEXT_TOKENS, temperature=0)
        )
        stream = await engine.submit(request)
        tokens, audio, finished = [], [], None
        async for event in stream:
            if isinstance(event, TextDelta):
                tokens += event.token_ids
            elif isinstance(event, AudioChunk):
                audio.append(event.samples)
            elif isinstance(event, Finished):
                finished = event
        return engine.intake.prompts.build(request.messages).token_ids, tokens, audio, finished

    try:
        results = await asyncio.gather(*(one(i, p) for i, p in enumerate(PROMPTS)))
        if copies > 1:  # the two replies went to different copies of each stage
            for name in ("talker.0", "talker.1", "code2wav.0", "code2wav.1"):
                assert engine.registry.get_sample_value("engine_stage_batch_size_count", {"stage": name}), name
        return results
    finally:
        await engine.stop()


def check_engine_equals_generate(
    tiny_checkpoint: Path, cache_dir: Path, device: str, code2wav: dict, top: dict, copies: int
) -> None:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    ramp = code2wav.get("ramp_frames")
    results = asyncio.run(_run_engine(cache_dir, device, dict(code2wav), top, copies))
    reference = Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_checkpoint).to(device).eval()
    for prompt_ids, tokens, chunks, finished in results:
        assert finished.timings.codec_frames == FRAMES
        if ramp:  # 2 + 3 + 4 frames, then the last 1: four chunks with audio
            assert len([c for c in chunks if c.size]) == 4
        assert_equals_generate(reference, device, prompt_ids, tokens, chunks)


def assert_equals_generate(reference, device: str, prompt_ids: list[int], tokens: list[int],
                           chunks: list[np.ndarray], parting_frames: int = 0, **inputs) -> None:
    """A reply of TEXT_TOKENS tokens and FRAMES frames equals greedy `generate(return_audio=True)` on its prompt
    (and `inputs`: its images' pixel_values and image_grid_thw, engine/intake/images.py's `patches`). The last `parting_frames` frames' samples may
    part: Code2Wav is causal, so a code drawn otherwise in a near tie changes its own frame's samples on, none
    before."""
    audio = np.concatenate(chunks)
    with torch.inference_mode():
        # transformers never feeds a reply's last token back, so it speaks one token less:
        # ask it for one more to speak the same text.
        sequences, wav = reference.generate(
            torch.tensor([prompt_ids], device=device),
            speaker="ethan",
            thinker_max_new_tokens=TEXT_TOKENS + 1,
            thinker_do_sample=False,
            talker_do_sample=False,
            talker_max_new_tokens=FRAMES + 1,
            return_audio=True,
            **inputs,
        )
    assert tokens == sequences[0, len(prompt_ids) : len(prompt_ids) + TEXT_TOKENS].tolist()
    expected = wav.reshape(-1).cpu().numpy()
    assert audio.shape == expected.shape
    # GPU kernels (TF32 matmuls, other reduction orders) round differently from the CPU's
    compared = audio.size - parting_frames * SAMPLES_PER_FRAME
    error = np.abs(audio - expected)[:compared]
    tolerance = 1e-4 if device == "cpu" else 2e-2
    off = np.flatnonzero(error > tolerance)
    # where it parts says what parted: one late frame (a near tie of the codes' argmax) or all of it
    assert off.size == 0, (f"audio off by up to {error.max():.3g} in {off.size} of {error.size} samples compared, "
                           f"from sample {off[0] if off.size else 0} of {audio.size}")
