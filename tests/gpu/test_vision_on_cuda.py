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
