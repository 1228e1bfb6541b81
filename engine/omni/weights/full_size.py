"""The released Qwen3-Omni-30B-A3B-Instruct dimensions, written out in full (transformers' class defaults are not
these), and `load_format: dummy`: random bf16 weights created on the target device, for benchmarks without the
real weights. Random models rarely stop, so dummy profiles fix output lengths (ignore_eos). With
`experts_on_meta` the experts' weights are left on the meta device, for FP8 experts to be drawn straight into
e4m3 one module at a time (fp8.py): the bf16 experts never exist at once."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch

from engine.omni.weights.checkpoint import StageName, stage_class
from engine.omni.weights.omni_config import omni_config
from engine.omni.weights.tiny import tiny_config_dict

_ROPE = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [24, 20, 20], "interleaved": True}


def full_size_config_dict() -> dict[str, Any]:
    config = copy.deepcopy(tiny_config_dict())  # the token ids are the same; every size below is replaced
    thinker = config["thinker_config"]
    thinker["audio_config"].update(
        d_model=1280, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
        downsample_hidden_size=480, output_dim=2048,
    )
    thinker["vision_config"].update(
        depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=2048,
        deepstack_visual_indexes=[8, 16, 24], num_position_embeddings=2304,
    )
    thinker["text_config"].update(
        vocab_size=152064, hidden_size=2048, intermediate_size=768, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, moe_intermediate_size=768,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, max_position_embeddings=65536,
        rope_parameters=_ROPE,
    )
    talker = config["talker_config"]
    talker.update(accept_hidden_layer=24, thinker_hidden_size=2048)
    talker["text_config"].update(
        vocab_size=3072, hidden_size=1024, intermediate_size=2048, num_hidden_layers=20,
        num_attention_heads=16, num_key_value_heads=2, head_dim=128, moe_intermediate_size=384,
        shared_expert_intermediate_size=768, num_experts=128, num_experts_per_tok=6, norm_topk_prob=True,
        max_position_embeddings=65536, rope_parameters=_ROPE,
    )
    talker["code_predictor_config"].update(
        vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=5,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, num_code_groups=16,
        layer_types=["full_attention"] * 5, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    )
    config["code2wav_config"].update(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=8, num_attention_heads=16,
        num_key_value_heads=16, sliding_window=72, decoder_dim=1536,
    )
    return config


def build_dummy_stage(stage: StageName, *, device: str, dtype: str,
                      experts_on_meta: bool = False) -> tuple[torch.nn.Module, Any]:
    """One stage at full size with random weights made on `device`; `experts_on_meta`: the experts' left unmade."""
    config = omni_config(full_size_config_dict())
    cls, sub = stage_class(stage, config)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    with torch.device(device), (experts_on_meta_device() if experts_on_meta else contextlib.nullcontext()):
        model = cls._from_config(sub, dtype=torch_dtype)
    if stage == "talker" and not experts_on_meta:
        draw_talker_experts(model, std=sub.initializer_range)
    return model.eval(), config


def draw_talker_experts(talker: torch.nn.Module, *, std: float) -> None:
    """transformers' init skips the Talker's stacked experts: they hold whatever `torch.empty` found (on a GPU
    at times NaN, which made every Talker logit NaN). Drawn from N(0, std), as transformers draws the Thinker's."""
    with torch.no_grad():
        for name, weight in talker.named_parameters():
            if ".experts." in name:
                weight.normal_(0.0, std)


@contextlib.contextmanager
def experts_on_meta_device() -> Iterator[None]:
    """Qwen3-Omni's experts modules built in here make their two weights on the meta device: transformers allocates
    them in the constructors, so those run under the meta device (start-up builds one stage at a time)."""
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as modeling

    classes = [modeling.Qwen3OmniMoeThinkerTextExperts, modeling.Qwen3OmniMoeTalkerTextExperts]
    constructors = [cls.__init__ for cls in classes]

    def on_meta(constructor: Any) -> Any:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            with torch.device("meta"):
                constructor(self, *args, **kwargs)
        return __init__

    for cls, constructor in zip(classes, constructors, strict=True):
        cls.__init__ = on_meta(constructor)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for cls, constructor in zip(classes, constructors, strict=True):
            cls.__init__ = constructor  # type: ignore[method-assign]
