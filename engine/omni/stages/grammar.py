"""Constrained decoding in the Thinker: each constrained reply's grammar state, and the batch's token masks.

`Grammars` compiles the admitted request's grammar text (engine/intake/constraints.py) against the Thinker's
tokenizer into a `GrammarState`, which advances one token per decoded token. Before each sampling step
`Grammars.mask` computes the allowed tokens of the batch's constrained rows, in parallel across rows, for the
sampler's `TokenMask`; a batch with no constrained row gets no mask. The masks are host work: on a GPU they are
computed while the step's forward still runs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.hf
import torch

from engine.omni.runners.sampler import TokenMask

log = logging.getLogger(__name__)


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
