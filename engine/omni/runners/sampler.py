"""Token sampling for a whole batch in one pass, each row with its own settings and seed.

Every row's randomness comes from a counter-based hash of (its seed, its draw
counter, the token id), so a seeded request draws the same tokens whatever batch
it shares, with no per-row generator, no host sync and a fixed kernel count per
step (what CUDA graphs need later).

Constrained decoding: `Grammars` compiles an admitted request's grammar text (engine/intake/constraints.py) against
the Thinker's tokenizer into a `GrammarState`, which advances one token per decoded token. Before each sampling
step `Grammars.mask` computes the allowed tokens of the batch's constrained rows, in parallel across rows, for the
`TokenMask`; a batch with no constrained row gets no mask. The masks are host work: on a GPU they are computed
while the step's forward still runs.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.hf
import torch

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RowSampling:
    """A request's sampling settings and its random stream (`draws` counts the batches it was in)."""

    temperature: float
    top_p: float
    top_k: int
    seed: int
    draws: int = 0


def new_seed(seed: int | None) -> int:
    return random.getrandbits(62) if seed is None else seed % (1 << 62)


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift on int64 (torch's >> keeps the sign)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def token_terms(vocab: int, device: torch.device | str) -> torch.Tensor:
    """Each token id's share of the hash [vocab]. torch.compile callers pass it in as a tensor:
    inductor (torch 2.11) folds arange * a 64-bit constant into an int32 index expression it cannot emit."""
    return torch.arange(vocab, device=device, dtype=torch.int64) * _GOLDEN


def uniform_noise(seeds: torch.Tensor, draws: torch.Tensor, vocab: int, terms: torch.Tensor | None = None) -> torch.Tensor:
    """[B] seeds, [B] counters -> [B, vocab] uniforms in (0, 1): splitmix64 of (seed, counter, token)."""
    terms = token_terms(vocab, seeds.device) if terms is None else terms
    x = (seeds * _GOLDEN + draws * _MIX1)[:, None] + terms[None, :]
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    x = x ^ _shr(x, 31)
    return (_shr(x, 11).to(torch.float64) + 0.5) / float(1 << 53)


def host_to_device(values: list | tuple, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A small host list on `device`, queued without the host waiting for the device's queued work."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


@dataclass(frozen=True, slots=True)
class RowTensors:
    """The batch's settings as device tensors [B] (what a captured graph reads)."""

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    seeds: torch.Tensor
    draws: torch.Tensor

    @staticmethod
    def of(rows: list[RowSampling], device: torch.device | str) -> RowTensors:
        def tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
            return host_to_device(values, dtype, device)

        return RowTensors(
            temperature=tensor([r.temperature for r in rows], torch.float32),
            top_p=tensor([r.top_p for r in rows], torch.float32),
            top_k=tensor([r.top_k for r in rows], torch.int64),
            seeds=tensor([r.seed for r in rows], torch.int64),
            draws=tensor([r.draws for r in rows], torch.int64),
        )


@dataclass(frozen=True, slots=True)
class TokenMask:
    """Some rows of a batch held to some tokens (constrained decoding). `rows`: their indices in the batch; `bits`
    [len(rows), words] int32 on the host: bit j of word w allows token 32 * w + j. Tokens past 32 * words (the
    model's vocab can be larger than its tokenizer's) are never allowed."""

    rows: list[int]
    bits: torch.Tensor


def allow_only(logits: torch.Tensor, allowed: TokenMask) -> torch.Tensor:
    """logits [B, V] with every token `allowed` does not allow at -inf, in its rows; a new tensor
    (the runner's logits may be a captured graph's output buffer)."""
    device, vocab = logits.device, logits.shape[-1]
    bits = allowed.bits.to(device, non_blocking=True)
    shifts = torch.arange(32, device=device, dtype=torch.int32)
    keep = ((bits[:, :, None] >> shifts) & 1).bool().flatten(1)  # [n, 32 * words]
    keep = keep[:, :vocab] if keep.shape[1] >= vocab else torch.nn.functional.pad(keep, (0, vocab - keep.shape[1]))
    rows = host_to_device(allowed.rows, torch.int64, device)
    masked = logits[rows].float().masked_fill(~keep, float("-inf"))
    return logits.float().index_put((rows,), masked)


def sample(logits: torch.Tensor, rows: list[RowSampling], allowed: TokenMask | None = None) -> torch.Tensor:
    """logits [B, V] -> token ids [B]. Temperature 0 is greedy. Advances each row's counter.
    `allowed`: rows held to some tokens; rows outside it (all, when None) cost nothing extra."""
    if allowed is not None:
        logits = allow_only(logits, allowed)
    tokens = sample_tensors(logits, RowTensors.of(rows, logits.device))
    for r in rows:
        r.draws += 1
    return tokens


def sample_tensors(
    logits: torch.Tensor, rows: RowTensors, draw_offset: int = 0, terms: torch.Tensor | None = None
) -> torch.Tensor:
    """`sample` with the settings already on the device: no host work, so it can be captured in a graph.
    `terms`: `token_terms(vocab)`, held by a caller that compiles this."""
    device = logits.device
    logits = logits.float()
    greedy = logits.argmax(dim=-1)
    scaled = logits / rows.temperature.clamp_min(1e-5)[:, None]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(logits.shape[-1], device=device)[None, :]
    keep = (rows.top_k[:, None] <= 0) | (rank < rows.top_k[:, None])
    sorted_logits = sorted_logits.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    # Drop a token when the mass before it already reaches top_p (the first always stays).
    probs = probs.masked_fill(probs.cumsum(-1) - probs >= rows.top_p[:, None], 0.0)
    # Exponential race: argmax of p / Exp(1) draws from p; the noise is indexed by token id, not rank.
    noise = -torch.log(uniform_noise(rows.seeds, rows.draws + draw_offset, logits.shape[-1], terms)).to(probs.dtype)
    choice = (probs / noise.gather(1, order)).argmax(dim=-1)
    sampled = order.gather(1, choice[:, None])[:, 0]
    return torch.where(rows.temperature > 0, sampled, greedy)


def penalise_seen(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style repetition penalty (as transformers applies it) on the ids `seen` [B, V] marks."""
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalised, logits)



@dataclass(slots=True)
class GrammarState:
    """One reply's place in its grammar."""

    matcher: llguidance.LLMatcher

    def accept(self, token_id: int) -> None:
        if not self.matcher.consume_token(token_id):
            log.error("grammar refused token %d: %s", token_id, self.matcher.get_error())

    @property
    def done(self) -> bool:
        """The grammar is complete and its end-of-reply token taken (or it failed: nothing more can follow)."""
        return self.matcher.is_stopped() or self.matcher.is_error()


class Grammars:
    """Owns the grammar engine's view of the tokenizer and the threads that compute masks. That view costs seconds of
    CPU under the GIL for Qwen's vocabulary, so it is built on the first constrained request, not at start-up."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._ll: llguidance.LLTokenizer | None = None
        self._executor: llguidance.LLExecutor | None = None
        self._lock = threading.Lock()

    def _engine(self) -> tuple[llguidance.LLTokenizer, llguidance.LLExecutor]:
        with self._lock:
            if self._ll is None or self._executor is None:
                self._ll = llguidance.hf.from_tokenizer(self._tokenizer)
                self._executor = llguidance.LLExecutor()
            return self._ll, self._executor

    def start(self, grammar: str) -> GrammarState:
        """A reply's state at the start of `grammar` (text that engine/intake/constraints.py made and checked)."""
        matcher = llguidance.LLMatcher(self._engine()[0], grammar, log_level=1)
        if matcher.is_error():
            raise ValueError(f"grammar does not compile: {matcher.get_error()}")
        return GrammarState(matcher)

    def mask(self, states: Sequence[GrammarState | None]) -> TokenMask | None:
        """The allowed tokens of a batch's constrained rows (those with a state); None when there are none."""
        rows = [i for i, state in enumerate(states) if state is not None]
        if not rows:
            return None
        ll, executor = self._engine()
        # (llguidance.torch wraps these two calls, but importing it sets up torch.compile: seconds)
        bits = torch.full((len(rows), (ll.vocab_size + 31) // 32), -1, dtype=torch.int32)
        row_bytes = bits.shape[1] * bits.element_size()
        matchers = [states[i].matcher for i in rows]  # type: ignore[union-attr]
        if len(matchers) == 1:
            matchers[0].unsafe_compute_mask_ptr(bits.data_ptr(), row_bytes)
        else:
            executor.unsafe_compute_mask_ptr([(m, k) for k, m in enumerate(matchers)], bits.data_ptr(), row_bytes,
                                             len(matchers))
        return TokenMask(rows, bits)
