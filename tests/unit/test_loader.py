"""Per-stage loading is strict, and a missing checkpoint fails at once with where it looked."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.omni.weights.checkpoint import CheckpointMismatch, CheckpointNotFound, load_stage, resolve_checkpoint


@pytest.mark.parametrize("stage", ["thinker", "talker", "code2wav"])
def test_each_stage_gets_exactly_the_combined_models_weights(tiny_checkpoint: Path, stage: str) -> None:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    combined = getattr(Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_checkpoint), stage).state_dict()
    loaded = load_stage(tiny_checkpoint, stage, device="cpu", dtype="float32").model.state_dict()
    assert loaded.keys() == combined.keys()
    for key, value in loaded.items():
        assert torch.equal(value, combined[key]), key


def test_a_missing_tensor_is_an_error_not_a_random_weight(tiny_checkpoint: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, broken)
    tensors = load_file(broken / "model.safetensors")
    del tensors["code2wav.code_embedding.weight"]
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointMismatch, match="code2wav weights .* 1 missing"):
        load_stage(broken, "code2wav", device="cpu", dtype="float32")


def test_an_absent_checkpoint_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFound, match="looked in: .*nowhere") as raised:
        resolve_checkpoint(str(tmp_path / "nowhere"), tmp_path)
    assert "Nothing is downloaded" in str(raised.value)
    with pytest.raises(CheckpointNotFound, match="Qwen/Qwen3-Omni-30B-A3B-Instruct"):
        resolve_checkpoint("Qwen/Qwen3-Omni-30B-A3B-Instruct", tmp_path)
