"""The staged, streaming, batched engine reproduces transformers' own Qwen3-Omni pipeline.

Reference: `Qwen3OmniMoeForConditionalGeneration.generate(return_audio=True)` on the
same tiny checkpoint, greedy everywhere. Two requests of different lengths run
concurrently in the engine, so their Talker and Code2Wav forwards are shared. The CUDA
variants are in the GPU lane (tests/gpu/).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from equivalence import check_engine_equals_generate

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton on a CPU: interpreter only")


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    ("code2wav", "top", "copies"),
    [
        ({}, {}, 1),
        ({"max_streams": 1}, {}, 1),  # the second reply's audio waits for the first's state slot
        ({}, {}, 2),  # two Talker and two Code2Wav copies, one reply each
        ({"ramp_frames": (3, 4)}, {}, 1),  # chunks of 2, 3, 4, then 8 frames
        # the Thinker paced to the Talker: who runs when, not what
        ({}, {"first_packet": {"text_lead": 2}}, 1),
        # our Triton MoE and decode attention, in Triton's CPU interpreter
        pytest.param({}, {"kernels": "triton"}, 1, marks=[needs_triton, needs_interpreter]),
    ],
    ids=["cpu", "cpu-one-stream-slot", "cpu-copies", "cpu-chunk-ramp", "cpu-first-packet-policy", "cpu-triton-kernels"],
)
def test_engine_equals_transformers_generate(
    tiny_checkpoint: Path, cache_dir: Path, code2wav: dict, top: dict, copies: int
) -> None:
    check_engine_equals_generate(tiny_checkpoint, cache_dir, "cpu", code2wav, top, copies)
