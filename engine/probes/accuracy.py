"""What FP8 experts cost in accuracy: bf16 and FP8 against a float32 reference on the same weights
(`voice-gateway accuracy`). Random weights say nothing of answer quality, so this compares numbers: the Thinker
continues a fixed prompt greedily in float32 (with transformers' experts), each variant reads it teacher-forced,
and the report holds the relative error of the logits and of the Talker's rows, top-1 agreement and top-10
overlap; the Talker's codec logits over random rows likewise. On a CPU the FP8 experts run the kernels'
arithmetic in plain torch (`fused_moe.enable_fp8_reference`), so the tiny model can be compared anywhere."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from engine.omni.accel import fp8, fused_moe
from engine.omni.weights.source import ModelSource

log = logging.getLogger(__name__)

PROMPT = ("<|im_start|>user\nTell me about the history of the bicycle, from the first wooden running machines "
          "to the bikes of today, and why its shape has changed so little.<|im_end|>\n<|im_start|>assistant\n")
TOP_K = 10


@dataclass(frozen=True, slots=True)
class Agreement:
    """One variant of one stage against the float32 reference, over the compared positions."""

    logits_rel_error: float  # mean over positions of |l - ref| / |ref|
    hidden_rel_error: float  # the same for the rows the next stage takes (the Thinker's to the Talker)
    top1_agreement: float  # share of positions whose top token is the reference's
    top10_overlap: float  # mean share of the reference's top 10 that the variant's top 10 holds
    positions: int


@dataclass(slots=True)
class AccuracyReport:
    model: str
    device: str
    steps: int
    seed: int
    experts_kernel: str  # "triton" (as served) or "dequantized" (transformers' experts on dequantized weights)
    thinker: dict[str, Agreement] = field(default_factory=dict)
    talker: dict[str, Agreement] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(logits: torch.Tensor, hidden: torch.Tensor, ref_logits: torch.Tensor,
            ref_hidden: torch.Tensor) -> Agreement:
    logits, hidden, ref_logits, ref_hidden = (t.float() for t in (logits, hidden, ref_logits, ref_hidden))

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float(((a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-30)).mean())

    top, ref_top = logits.topk(TOP_K).indices, ref_logits.topk(TOP_K).indices
    overlap = (top[:, :, None] == ref_top[:, None, :]).any(-1).float().mean()
    return Agreement(rel(logits, ref_logits), rel(hidden, ref_hidden),
                     float((top[:, 0] == ref_top[:, 0]).float().mean()), float(overlap), logits.shape[0])


def measure(model: str = "tiny", *, load_format: str = "auto", device: str = "cpu", steps: int = 256,
            seed: int = 0, cache_dir: Any = None) -> AccuracyReport:
    started = time.perf_counter()
    source = ModelSource.open(model, load_format, cache_dir)  # type: ignore[arg-type]
    on_gpu = device.startswith("cuda")
    report = AccuracyReport(model, device, steps, seed, "triton" if on_gpu else "dequantized")
    tokenizer_ids = _prompt_ids(source)
    torch.manual_seed(seed)
    thinker = source.load_stage("thinker", device=device, dtype="float32")
    capture = source.config.talker_config.accept_hidden_layer
    with torch.inference_mode(), _exact_float32():
        ids = _greedy(thinker, tokenizer_ids, steps, device)
    report.thinker = _variants(thinker, lambda m: _thinker_rows(m, ids, capture), len(tokenizer_ids), on_gpu)
    del thinker
    torch.manual_seed(seed)
    talker = source.load_stage("talker", device=device, dtype="float32")
    with torch.inference_mode():
        rows = _talker_inputs(talker, len(ids), seed, device)
    report.talker = _variants(talker, lambda m: _talker_rows(m, rows), 0, on_gpu)
    report.seconds = round(time.perf_counter() - started, 1)
    return report


def _prompt_ids(source: ModelSource) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source.path).encode(PROMPT, add_special_tokens=False)


@contextlib.contextmanager
def _exact_float32() -> Iterator[None]:
    """The reference in float32 proper: no TF32 matmuls on a GPU."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _greedy(thinker: Any, prompt: list[int], steps: int, device: str) -> torch.Tensor:
    """The prompt and its float32 greedy continuation of exactly `steps` tokens (end of turn not honoured)."""
    ids = torch.tensor([prompt], device=device)
    out = thinker.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, eos_token_id=None)
    return out[0]


def _thinker_rows(thinker: Any, ids: torch.Tensor, capture: int) -> tuple[torch.Tensor, torch.Tensor]:
    out = thinker(input_ids=ids[None], output_hidden_states=True, use_cache=False)
    return out.logits[0], out.hidden_states[capture][0]


def _talker_inputs(talker: Any, n: int, seed: int, device: str) -> torch.Tensor:
    embedding = talker.get_input_embeddings().weight
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(n, embedding.shape[1], generator=gen, device=device) * float(embedding.std())


def _talker_rows(talker: Any, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    hidden = talker.model(inputs_embeds=rows[None].to(talker.dtype), use_cache=False).last_hidden_state[0]
    return talker.codec_head(hidden), hidden


def _variants(model: Any, rows_of: Any, skip: int, on_gpu: bool) -> dict[str, Agreement]:
    """float32 (eager experts) -> bf16 -> FP8, one model converted in place: the same weights throughout."""
    with torch.inference_mode():
        with _exact_float32():
            ref_logits, ref_hidden = (t[skip:].float() for t in rows_of(model))
        for param in model.parameters():  # as served: bf16 weights, float32 buffers (rotary frequencies)
            param.data = param.data.to(torch.bfloat16)
        if on_gpu:
            fused_moe.enable(model)
        out: dict[str, Agreement] = {}
        logits, hidden = rows_of(model)
        out["bf16"] = compare(logits[skip:], hidden[skip:], ref_logits, ref_hidden)
        fp8.quantize_experts(model)
        if not on_gpu:
            fused_moe.enable_fp8_reference(model)
        logits, hidden = rows_of(model)
        out["fp8"] = compare(logits[skip:], hidden[skip:], ref_logits, ref_hidden)
    for name, agreement in out.items():
        log.info("%s %s: logits %.2e, hidden %.2e relative error; top-1 %.3f, top-10 %.3f", type(model).__name__,
                 name, agreement.logits_rel_error, agreement.hidden_rel_error, agreement.top1_agreement,
                 agreement.top10_overlap)
    return out

