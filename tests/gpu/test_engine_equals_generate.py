"""The Omni engine on a GPU reproduces transformers' own pipeline: plain, with our Triton kernels, and
with everything the GPU profile turns on (kernels, CUDA graphs of prefills alone and in groups, decode
steps with compiled layers, the compiled code predictor, Code2Wav buckets)."""

from __future__ import annotations

from pathlib import Path

import pytest
from equivalence import check_engine_equals_generate


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("top", [{}, {"kernels": "triton"}, {"kernels": "triton", "cuda_graphs": True}],
                         ids=["cuda", "cuda-triton-kernels", "cuda-graphs-kernels"])
def test_engine_equals_transformers_generate_on_cuda(tiny_checkpoint: Path, cache_dir: Path, top: dict) -> None:
    check_engine_equals_generate(tiny_checkpoint, cache_dir, "cuda", {}, top, 1)
