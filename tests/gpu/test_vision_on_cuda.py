"""Images and a video through the Omni engine on a GPU, with everything the GPU profile turns on (our kernels,
CUDA graphs): the same tokens and speech as transformers' generate() on the same GPU. A prompt with an image
prefills eagerly; its reply's decode steps replay graphs with the prompt's M-RoPE rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.equivalence import assert_equals_generate
from tests.unit.test_vision import _engine, _generate_inputs, every_conversation


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_images_and_a_video_on_cuda_equal_generate(tiny_checkpoint: Path, cache_dir: Path) -> None:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    prompts, results = every_conversation(_engine(cache_dir, "cuda", {"kernels": "triton", "cuda_graphs": True}))
    reference = Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_checkpoint).to("cuda").eval()
    for prompt, (tokens, audio, _) in zip(prompts, results, strict=True):
        inputs = {k: v.to("cuda") for k, v in _generate_inputs(prompt).items()}
        # the engine's codes are the same graphed or eager (test_graphs_equal_eager); generate()'s own CUDA arithmetic
        # draws another code in a near tie in the last frame of one conversation, so that frame may part
        assert_equals_generate(reference, "cuda", prompt.token_ids, tokens, audio, parting_frames=1, **inputs)


def test_the_graphed_tower_equals_the_eager_one(cache_dir: Path) -> None:
    """Pictures of graphed sizes replay one graph each, a size repeated within a call too; a call holding a size
    without a graph runs eagerly: both give the eager tower's rows (float32: the replays' GEMMs see other row
    counts than the eager call's, and bf16 would round those apart)."""
    from types import SimpleNamespace

    import numpy as np
    import torch
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as modeling

    from engine.intake.images import ImagePreprocessor
    from engine.omni.runners.vision_tower import VisionTower
    from engine.omni.weights.source import ModelSource
    from engine.profile import ThinkerConfig

    vision_config = ModelSource.open("tiny", cache_dir=cache_dir).config.thinker_config.vision_config
    limits = ThinkerConfig()
    resize = ImagePreprocessor(vision_config, min_pixels=limits.image_min_pixels, max_pixels=limits.image_max_pixels)
    rng = np.random.default_rng(0)
    camera, phone, odd = ((rng.random((h, w, 3)) * 255).astype(np.uint8) for h, w in ((720, 1280), (480, 640), (300, 500)))
    images = [resize(pixels, -1 - i) for i, pixels in enumerate((camera, phone, camera, odd))]
    with torch.device("cuda"):
        encoder = modeling.Qwen3OmniMoeVisionEncoder._from_config(vision_config, dtype=torch.float32).eval()
    tower = VisionTower(SimpleNamespace(visual=encoder))
    with torch.inference_mode():
        eager = [tower(images[:3]), tower(images)]
        assert tower.capture([resize.grid(720, 1280), resize.grid(480, 640)]) == 2
        graphed = [tower(images[:3]), tower(images)]
    for want, got in zip(eager, graphed, strict=True):
        torch.testing.assert_close(got.embeds, want.embeds, atol=1e-4, rtol=1e-4)
        for a, b in zip(got.deepstack, want.deepstack, strict=True):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
