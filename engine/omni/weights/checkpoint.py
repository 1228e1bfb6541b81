"""Finding a Qwen3-Omni checkpoint and loading one stage's sub-model from it, strictly: a stage loaded out of the
combined checkpoint can silently keep random weights (the talker's fused experts, all of Code2Wav without its
prefix), so every load checks its keys and fails loudly on any gap."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from engine.omni.weights.omni_config import read_omni_config

log = logging.getLogger(__name__)

StageName = Literal["thinker", "talker", "code2wav"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CheckpointNotFound(FileNotFoundError):
    pass


class CheckpointMismatch(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class LoadedStage:
    model: torch.nn.Module
    config: Any  # the full Qwen3OmniMoeConfig: stages need the shared token ids


def resolve_checkpoint(model: str, cache_dir: Path) -> Path:
    """A local directory, or a hub id already in the local Hugging Face cache; never downloads."""
    from engine.omni.weights.tiny import TINY_MODEL_ID, ensure_tiny_checkpoint

    if model == TINY_MODEL_ID:
        return ensure_tiny_checkpoint(cache_dir)
    looked: list[str] = []
    path = Path(model).expanduser()
    looked.append(str(path.resolve()))
    if (path / "config.json").is_file():
        return path
    if re.fullmatch(r"[\w.-]+/[\w.-]+", model):
        from huggingface_hub import constants, try_to_load_from_cache

        found = try_to_load_from_cache(model, "config.json")
        looked.append(f"{constants.HF_HUB_CACHE} (repo {model})")
        if isinstance(found, str):
            return Path(found).parent
    raise CheckpointNotFound(
        f"checkpoint {model!r} is not on this machine; looked in: {'; '.join(looked)}. "
        "Nothing is downloaded at run time: put the checkpoint in a local directory or the "
        "Hugging Face cache first (e.g. `hf download <repo>`), or use the built-in `tiny` model."
    )


def load_config(path: Path) -> Any:
    config = read_omni_config(path)
    if not config.enable_audio_output:
        log.warning("%s has no talker (enable_audio_output=false): audio replies are unavailable", path)
    return config


def stage_class(stage: StageName, config: Any) -> tuple[Any, Any]:
    """transformers' class for one stage's sub-model, and that stage's part of the whole config."""
    from transformers import (
        Qwen3OmniMoeCode2Wav,
        Qwen3OmniMoeTalkerForConditionalGeneration,
        Qwen3OmniMoeThinkerForConditionalGeneration,
    )

    return {
        "thinker": (Qwen3OmniMoeThinkerForConditionalGeneration, config.thinker_config),
        "talker": (Qwen3OmniMoeTalkerForConditionalGeneration, config.talker_config),
        "code2wav": (Qwen3OmniMoeCode2Wav, config.code2wav_config),
    }[stage]


def load_stage(path: Path, stage: StageName, *, device: str, dtype: str) -> LoadedStage:
    from transformers.utils import logging as hf_logging

    config = load_config(path)
    cls, sub_config = stage_class(stage, config)
    log.info("loading %s from %s (%s, %s)", stage, path, device, dtype)
    # We check the keys ourselves below; the library's report would list every other stage's keys.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, info = cls.from_pretrained(
            path,
            config=sub_config,
            dtype=_DTYPES[dtype],
            key_mapping={rf"^{stage}\.": ""},
            output_loading_info=True,
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    missing = set(info["missing_keys"])
    consumed: set[str] = set()
    if stage == "talker" and missing:
        filled, consumed = _load_fused_experts(path, model, prefix="talker.", missing=missing)
        missing -= filled
    foreign = [
        k
        for k in info["unexpected_keys"]
        if not k.startswith(("thinker.", "talker.", "code2wav.")) and k not in consumed
    ]
    problems = sorted(missing)[:5] + foreign[:5] + [str(m) for m in info["mismatched_keys"]][:5]
    if problems:
        raise CheckpointMismatch(
            f"{stage} weights in {path} do not match the model: {len(missing)} missing, "
            f"{len(foreign)} unexpected, {len(info['mismatched_keys'])} mismatched (first: {problems})"
        )
    return LoadedStage(model=model.to(device).eval(), config=config)


def _load_fused_experts(
    path: Path, model: torch.nn.Module, *, prefix: str, missing: set[str]
) -> tuple[set[str], set[str]]:
    """Checkpoints store experts one by one; the model holds them stacked as 3-D tensors. The talker's config has an
    empty model_type, so transformers finds no conversion for it loaded alone. -> the keys it filled and the
    per-expert keys it used."""
    filled: set[str] = set()
    consumed: set[str] = set()
    params = dict(model.named_parameters())
    reader = _TensorReader(_safetensor_files(path))
    pattern = re.compile(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")
    for key in sorted(missing):
        m = pattern.match(key)
        if not m:
            continue
        base, kind = m.groups()
        target = params[key]
        num_experts = target.shape[0]
        with torch.no_grad():
            for e in range(num_experts):
                parts = ["down_proj"] if kind == "down_proj" else ["gate_proj", "up_proj"]
                names = [f"{base}.{e}.{part}.weight" for part in parts]
                target[e].copy_(torch.cat([reader.get(prefix + name) for name in names], dim=0))
                consumed.update(names)
        filled.add(key)
    return filled, consumed


def _safetensor_files(path: Path) -> dict[str, Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {k: path / v for k, v in weight_map.items()}
    from safetensors import safe_open

    single = path / "model.safetensors"
    with safe_open(single, framework="pt") as f:
        return {k: single for k in f.keys()}


class _TensorReader:
    """Reads single tensors, keeping each shard open once."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files
        self.handles: dict[Path, Any] = {}

    def get(self, key: str) -> torch.Tensor:
        from safetensors import safe_open

        if key not in self.files:
            raise CheckpointMismatch(f"checkpoint has no tensor {key}")
        shard = self.files[key]
        if shard not in self.handles:
            self.handles[shard] = safe_open(shard, framework="pt")
        return self.handles[shard].get_tensor(key)
