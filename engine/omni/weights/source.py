"""Where a model comes from: its config, its tokenizer and, per stage on request, its weights. `ModelSource.open`
reads only the config and never downloads: a local directory, a hub id in the Hugging Face cache, `tiny` (built
on first use), or `load_format: dummy` (the released dimensions, random weights). The front door needs the config
and tokenizer only; each stage loads its own weights when the engine is built."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from engine.api import EngineError
from engine.omni.weights.cache import build_once, default_cache_dir
from engine.omni.weights.checkpoint import StageName, load_config, load_stage, resolve_checkpoint
from engine.omni.weights.full_size import build_dummy_stage, full_size_config_dict
from engine.omni.weights.omni_config import omni_config
from engine.omni.weights.tiny import TINY_DESCRIPTION, TINY_MODEL_ID

log = logging.getLogger(__name__)

DUMMY_DESCRIPTION = "full-size Qwen3-Omni with random weights (load_format=dummy): for benchmarks only"
_DUMMY_FRONT_VERSION = "v1"


@dataclass(frozen=True, slots=True)
class ModelSource:
    model_id: str
    path: Path  # config, tokenizer and feature-extractor files (for dummy weights: ours, built once)
    config: Any  # Qwen3OmniMoeConfig of the whole model
    load_format: Literal["auto", "dummy"]
    cache_dir: Path  # where our own built files go: the dummy weights' front files, the compiled kernels

    @classmethod
    def open(cls, model: str, load_format: Literal["auto", "dummy"] = "auto",
             cache_dir: Path | None = None) -> ModelSource:
        cache_dir = cache_dir or default_cache_dir()
        if load_format == "dummy":
            log.warning("load_format=dummy: full-size architecture with RANDOM weights, for benchmarks only")
            return cls(model, _dummy_front(cache_dir), omni_config(full_size_config_dict()), "dummy", cache_dir)
        path = resolve_checkpoint(model, cache_dir)
        if model == TINY_MODEL_ID:
            log.warning("serving the tiny random-weight model: %s", TINY_DESCRIPTION)
        return cls(model, path, load_config(path), "auto", cache_dir)

    @property
    def is_random_weights(self) -> bool:
        return self.load_format == "dummy" or self.model_id == TINY_MODEL_ID

    @property
    def description(self) -> str:
        if self.load_format == "dummy":
            return DUMMY_DESCRIPTION
        return TINY_DESCRIPTION if self.model_id == TINY_MODEL_ID else f"Qwen3-Omni checkpoint at {self.path}"

    @property
    def has_talker(self) -> bool:
        return bool(self.config.enable_audio_output)

    @property
    def speakers(self) -> tuple[str, ...]:
        return tuple(sorted(self.config.talker_config.speaker_id or {})) if self.has_talker else ()

    @property
    def frame_samples(self) -> int:
        """24 kHz samples per codec frame: Code2Wav's total upsampling."""
        c = self.config.code2wav_config
        return math.prod(c.upsample_rates) * math.prod(c.upsampling_ratios) if self.has_talker else 0

    def tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.path)

    def feature_extractor(self) -> Any:
        from transformers import WhisperFeatureExtractor

        return WhisperFeatureExtractor.from_pretrained(self.path)

    def load_stage(self, stage: StageName, *, device: str, dtype: str,
                   experts_on_meta: bool = False) -> torch.nn.Module:
        """One stage's sub-model on `device`, strictly loaded (random for dummy weights; see `experts_on_meta`)."""
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise EngineError(f"the deploy profile asks for {device}, but CUDA is not available here")
        if self.load_format == "dummy":
            return build_dummy_stage(stage, device=device, dtype=dtype, experts_on_meta=experts_on_meta)[0]
        assert not experts_on_meta, "only dummy weights are made rather than loaded"
        return load_stage(self.path, stage, device=device, dtype=dtype).model


def _dummy_front(cache_dir: Path) -> Path:
    """The tokenizer and feature-extractor files dummy weights are served with, built once (atomically)."""
    return build_once(cache_dir / f"dummy-qwen3-omni-front-{_DUMMY_FRONT_VERSION}", "preprocessor_config.json",
                      _build_dummy_front)


def _build_dummy_front(folder: Path) -> None:
    from transformers import WhisperFeatureExtractor

    from engine.omni.weights.tokenizer import build_tokenizer  # transformers' converters: only when building

    build_tokenizer(folder)
    WhisperFeatureExtractor(feature_size=128, sampling_rate=16_000, padding_value=0.0).save_pretrained(folder)
