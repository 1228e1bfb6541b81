"""The tiny checkpoint: real Qwen3-Omni classes at toy size, seeded random weights.

It keeps the released model's token ids (Thinker vocab 152064, the real special
and codec ids) so one prompt path serves tiny and real checkpoints alike. Its
speech is noise and its text gibberish; everything around the math is real.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from engine.omni.weights.cache import build_once
from engine.omni.weights.omni_config import omni_config

TINY_VERSION = "v3"
TINY_SEED = 1234
TINY_MODEL_ID = "tiny"
TINY_DESCRIPTION = (
    "tiny Qwen3-Omni with random weights: its speech is noise and its text gibberish; "
    "the engine mechanics, latency and protocol are real"
)

log = logging.getLogger(__name__)

# mrope_section must sum to head_dim / 2.
_TINY_ROPE = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [4, 2, 2], "interleaved": True}


def tiny_config_dict() -> dict[str, Any]:
    thinker_hidden = 64
    return {
        "enable_audio_output": True,
        "im_start_token_id": 151644,
        "im_end_token_id": 151645,
        "tts_pad_token_id": 151671,
        "tts_bos_token_id": 151672,
        "tts_eos_token_id": 151673,
        "system_token_id": 8948,
        "user_token_id": 872,
        "assistant_token_id": 77091,
        "thinker_config": {
            "audio_token_id": 151675,
            "audio_start_token_id": 151669,
            "image_token_id": 151655,
            "video_token_id": 151656,
            "vision_start_token_id": 151652,
            "user_token_id": 872,
            "position_id_per_seconds": 13,
            "audio_config": {
                "num_mel_bins": 128,
                "d_model": 64,
                "encoder_layers": 2,
                "encoder_attention_heads": 4,
                "encoder_ffn_dim": 128,
                "downsample_hidden_size": 32,
                "output_dim": thinker_hidden,
                "n_window": 50,
                "n_window_infer": 800,
                "max_source_positions": 1500,
            },
            "vision_config": {
                "depth": 1,
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_heads": 2,
                "out_hidden_size": thinker_hidden,
                "deepstack_visual_indexes": [0],
                "num_position_embeddings": 64,
            },
            "text_config": {
                "vocab_size": 152064,
                "hidden_size": thinker_hidden,
                "intermediate_size": 128,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "moe_intermediate_size": 32,
                "num_experts": 8,
                "num_experts_per_tok": 2,
                "max_position_embeddings": 4096,
                "rope_parameters": _TINY_ROPE,
            },
        },
        "talker_config": {
            "accept_hidden_layer": 2,
            "thinker_hidden_size": thinker_hidden,
            "num_code_groups": 16,
            "codec_pad_id": 2148,
            "codec_bos_id": 2149,
            "codec_eos_token_id": 2150,
            "codec_nothink_id": 2155,
            "codec_think_bos_id": 2156,
            "codec_think_eos_id": 2157,
            "speaker_id": {"chelsie": 2301, "ethan": 2302, "aiden": 2303},
            "audio_token_id": 151675,
            "audio_start_token_id": 151669,
            "image_token_id": 151655,
            "video_token_id": 151656,
            "vision_start_token_id": 151652,
            "position_id_per_seconds": 13,
            "spatial_merge_size": 2,
            "text_config": {
                # A talker vocab is codebook size + 1024: generate() suppresses the top 1024 ids.
                "vocab_size": 3072,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "moe_intermediate_size": 32,
                "shared_expert_intermediate_size": 64,
                "num_experts": 8,
                "num_experts_per_tok": 2,
                "max_position_embeddings": 4096,
                "rope_parameters": _TINY_ROPE,
            },
            "code_predictor_config": {
                "vocab_size": 2048,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "num_code_groups": 16,
                "layer_types": ["full_attention", "full_attention"],
            },
        },
        "code2wav_config": {
            "codebook_size": 2048,
            "num_quantizers": 16,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            # A short window keeps the decoder's receptive field inside the chunk's left context,
            # so chunked decoding equals a one-shot decode exactly (the released model uses 72).
            "sliding_window": 4,
            "upsample_rates": [8, 5, 4, 3],
            "upsampling_ratios": [2, 2],
            "decoder_dim": 64,
        },
    }


def build_tiny_checkpoint(out_dir: Path) -> None:
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration, WhisperFeatureExtractor

    from engine.omni.weights.tokenizer import build_tokenizer

    torch.manual_seed(TINY_SEED)
    config = omni_config(tiny_config_dict())
    model = Qwen3OmniMoeForConditionalGeneration(config).eval()
    # Default init gives near-constant logits; a wider spread makes sampling (and the noise) audible.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("codec_head.weight") or "lm_head" in name:
                p.normal_(0.0, 0.5)
            elif name.startswith("talker.") and ".experts." in name:
                # transformers' init skips the talker's stacked experts (left as torch.empty: near-zero
                # garbage); a MoE that adds nothing would let a wrong experts path pass every test
                p.normal_(0.0, 0.02)  # the std transformers gives the thinker's experts
        # Random Code2Wav output is ~1e-7 loud; scale its last conv so the noise is audible (~-20 dBFS).
        codes = torch.randint(0, 2048, (1, 16, 25), generator=torch.Generator().manual_seed(TINY_SEED))
        rms = model.code2wav(codes).pow(2).mean().sqrt()
        last_conv = model.code2wav.decoder[-1].conv
        last_conv.weight.mul_(0.1 / rms)
        last_conv.bias.mul_(0.1 / rms)
    model.save_pretrained(out_dir)
    build_tokenizer(out_dir)
    WhisperFeatureExtractor(feature_size=128, sampling_rate=16_000, padding_value=0.0).save_pretrained(out_dir)
    (out_dir / "TINY_MODEL.txt").write_text(TINY_DESCRIPTION + "\n")


def ensure_tiny_checkpoint(cache_dir: Path) -> Path:
    """Return the tiny checkpoint's directory, building it on first use (atomically)."""
    target = cache_dir / f"tiny-qwen3-omni-{TINY_VERSION}"
    if not (target / "TINY_MODEL.txt").exists():
        log.info("building the tiny random-weight checkpoint in %s (first use only)", target)
    return build_once(target, "TINY_MODEL.txt", build_tiny_checkpoint)
