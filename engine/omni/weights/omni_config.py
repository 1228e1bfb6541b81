"""Qwen3OmniMoeConfig, made from values or read from a checkpoint, with the talker's M-RoPE keys declared.

The talker's rotary embedding is the thinker's and reads `rope_parameters["mrope_section"]` (its default,
[24, 20, 20], fits only head_dim 128), so the talker's `rope_parameters` carry the thinker's M-RoPE keys.
transformers declares those keys to its rope validation on the thinker's text config but not on the talker's,
and so warns of "Unrecognized keys" its own model reads at every start-up; declaring them on the talker's config
class too makes the validation describe the model it validates."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def declare_talker_mrope_keys() -> None:
    """Tell transformers' talker text config the M-RoPE keys its rotary embedding reads (idempotent)."""
    from transformers.models.qwen3_omni_moe import configuration_qwen3_omni_moe as omni

    thinker_keys = set(omni.Qwen3OmniMoeTextConfig.ignore_keys_at_rope_validation)
    talker = omni.Qwen3OmniMoeTalkerTextConfig
    if not thinker_keys <= set(talker.ignore_keys_at_rope_validation or ()):
        talker.ignore_keys_at_rope_validation = set(talker.ignore_keys_at_rope_validation or ()) | thinker_keys


def omni_config(values: dict[str, Any]) -> Any:
    """A Qwen3OmniMoeConfig from a config dict (the tiny builder's, the full-size dummy's)."""
    from transformers import Qwen3OmniMoeConfig

    declare_talker_mrope_keys()
    return Qwen3OmniMoeConfig(**values)


def read_omni_config(path: Path) -> Any:
    from transformers import Qwen3OmniMoeConfig

    declare_talker_mrope_keys()
    return Qwen3OmniMoeConfig.from_pretrained(path)
