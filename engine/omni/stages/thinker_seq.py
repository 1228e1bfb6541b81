"""A Thinker request as the Thinker stage schedules it (`ThinkerSeq`: where its prompt and reply stand, what it
handed the Talker, its text so far) and one step's work (`ThinkerBatch`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from engine.handoff import AdmittedRequest
from engine.omni.runners.sampler import GrammarState, RowSampling
from engine.omni.runners.thinker import StepRow
from engine.positions import Rope


@dataclass(slots=True)
class ThinkerSeq:
    job: AdmittedRequest
    sampling: RowSampling
    keys: np.ndarray  # per prompt position, what a cached prefix must hold there (engine/omni/runners/prefix_cache.py)
    clips: list[tuple[int, int]]  # [start, end) of each audio clip's placeholders, in prompt order
    images: list[tuple[int, int]]  # and of each image's
    rope: Rope | None = None  # with images, the M-RoPE rows of the prompt and its reply; None: the positions
    slot: int = -1
    position: int = 0  # tokens in the KV cache
    cached: int = 0  # of the prompt, tokens a cached prefix held
    # the Talker's prompt rows so far (when it speaks): a cached prefix's, then each prefilled piece's
    embeds: list[torch.Tensor] = field(default_factory=list)
    hidden: list[torch.Tensor] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    # incremental detokenisation: ids before `text_from` are emitted and never decoded again;
    # [text_from, text_to) were decoded last time and give the context for the next piece
    text_from: int = 0
    text_to: int = 0
    spoken: int = 0  # text rows the Talker has consumed (when pacing), and those it never gets
    talker_done: bool = False
    grammar: GrammarState | None = None  # a constrained reply's place in its grammar
    in_tool_call: bool = False  # inside <tool_call>...</tool_call>: text the Talker never gets
    after_tool_call: bool = False  # and the whitespace after it (between calls) neither
    last_token_at: float = 0.0  # perf_counter() of its latest token

    @property
    def paced(self) -> bool:
        return self.job.want_audio and not self.talker_done

    @property
    def made(self) -> int:
        return len(self.generated)

    @property
    def prompt_len(self) -> int:
        return len(self.job.token_ids)


@dataclass(slots=True)
class ThinkerBatch:
    """One step's work: prompt pieces (each sequence and where its piece ends), then a row per running reply."""

    pieces: list[tuple[ThinkerSeq, int]]
    replies: list[ThinkerSeq]
    rows: list[StepRow]

    @property
    def request_ids(self) -> list[str]:
        return [s.job.request_id for s, _ in self.pieces] + [s.job.request_id for s in self.replies]
