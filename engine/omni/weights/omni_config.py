"""Qwen3OmniMoeConfig, made from values or read from a checkpoint, with the talker's M-RoPE keys declared.

The talker's rotary embedding is the thinker's (transformers' `Qwen3OmniMoeTalkerRotaryEmbedding` subclasses
`Qwen3OmniMoeThinkerTextRotaryEmbedding`) and reads `rope_parameters["mrope_section"]`, defaulting to the
released model's [24, 20, 20], which fits only head_dim 128. So the talker's `rope_parameters` carry the same
M-RoPE keys as the thinker's, in the released config.json and in ours. transformers (5.x) declares those keys
to its rope validation on the thinker's text config (`ignore_keys_at_rope_validation`) but not on the
talker's, so every talker config it builds logs "Unrecognized keys in `rope_parameters`" for keys its own
model reads: six lines at each start-up, one per config the stages read. Declaring them on the talker's
config class, as on the thinker's, makes the validation describe the model it validates.
"""

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
    """The Qwen3OmniMoeConfig of the checkpoint in `path`."""
    from transformers import Qwen3OmniMoeConfig

    declare_talker_mrope_keys()
    return Qwen3OmniMoeConfig.from_pretrained(path)
