"""Images and a video through the staged engine on a GPU, with everything the GPU profile turns on (our kernels,
CUDA graphs): the same tokens and speech as transformers' generate() on the same GPU. A prompt with an image
prefills eagerly; its reply's decode steps replay graphs with the prompt's M-RoPE rows."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engine import create_engine
from engine.profile import load_profile
from tests.equivalence import FRAMES, assert_equals_generate
from tests.unit.test_vision import CONVERSATIONS, GREEDY, _generate_inputs, _reply


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_images_and_a_video_on_cuda_equal_generate(tiny_checkpoint: Path, cache_dir: Path) -> None:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    on = {"device": "cuda"}
    profile = load_profile(model="tiny", platform="cpu", overrides={"kernels": "triton", "cuda_graphs": True},
                           stage_overrides={"thinker": on, "code2wav": on, "talker": {
                               **on, "max_frames": FRAMES, "sampling": GREEDY, "code_sampling": GREEDY}})

    async def run():
        engine = create_engine("tiny", profile, cache_dir)
        await engine.start()
        try:
            results = await asyncio.gather(*(_reply(engine, name, m) for name, m in CONVERSATIONS.items()))
            return [engine.admission.prompts.build(m) for m in CONVERSATIONS.values()], results
        finally:
            await engine.stop()

    prompts, results = asyncio.run(run())
    reference = Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_checkpoint).to("cuda").eval()
    for prompt, (tokens, audio, _) in zip(prompts, results, strict=True):
        inputs = {k: v.to("cuda") for k, v in _generate_inputs(prompt).items()}
        assert_equals_generate(reference, "cuda", prompt.token_ids, tokens, audio, **inputs)
