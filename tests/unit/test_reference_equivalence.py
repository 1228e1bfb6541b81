"""The staged, streaming, batched engine reproduces transformers' own Qwen3-Omni pipeline.

Reference: `Qwen3OmniMoeForConditionalGeneration.generate(return_audio=True)` on the
same tiny checkpoint, greedy everywhere. Two requests of different lengths run
concurrently in the engine, so their Talker and Code2Wav forwards are shared.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.api import AudioChunk, EngineRequest, Finished, Message, SamplingParams, TextDelta, TextPart, create_engine
from engine.profile import load_profile

TEXT_TOKENS = 6
FRAMES = 10
PROMPTS = ["Hello there", "Please describe, in a few careful words, the colour of the evening sea."]


async def _run_engine(
    cache_dir: Path, device: str, code2wav: dict
) -> list[tuple[list[int], list[int], np.ndarray, Finished]]:
    greedy = {"temperature": 0}
    on = {"device": device}
    profile = load_profile(
        model="tiny",
        platform="cpu",
        stage_overrides={
            "thinker": on,
            "talker": {**on, "max_frames": FRAMES, "sampling": greedy, "code_sampling": greedy},
            "code2wav": {**on, **code2wav},
        },
    )
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
        return engine.prompt_builder.build(request.messages).token_ids, tokens, np.concatenate(audio), finished

    try:
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(PROMPTS)))
    finally:
        await engine.stop()


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    ("device", "code2wav"),
    [
        ("cpu", {}),
        ("cpu", {"max_streams": 1}),  # the second reply's audio waits for the first's state slot
        ("cpu", {"streaming": False}),  # chunks re-decode their left context instead
        pytest.param("cuda", {}, marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")),
    ],
    ids=["cpu", "cpu-one-stream-slot", "cpu-windowed", "cuda"],
)
def test_engine_equals_transformers_generate(tiny_checkpoint: Path, cache_dir: Path, device: str, code2wav: dict) -> None:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    results = asyncio.run(_run_engine(cache_dir, device, code2wav))
    reference = Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_checkpoint).to(device).eval()
    for prompt_ids, tokens, audio, finished in results:
        assert finished.timings.codec_frames == FRAMES
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
            )
        assert tokens == sequences[0, len(prompt_ids) : len(prompt_ids) + TEXT_TOKENS].tolist()
        expected = wav.reshape(-1).cpu().numpy()
        assert audio.shape == expected.shape
        # GPU kernels (TF32 matmuls, other reduction orders) round differently from the CPU's
        assert np.abs(audio - expected).max() <= (1e-4 if device == "cpu" else 2e-2)
