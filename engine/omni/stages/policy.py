"""First-packet priority in one place: what waits, and for how long, so that a reply's first audio comes early.

A reply is heard from its first audio chunk on, so while some reply still waits for that chunk,
work for replies already speaking (or text far ahead of its speech) only takes the GPU from it.
The rules, each measured on the H200 (docs/performance.md):

* Text pacing (`text_lead` > 0): the Thinker decodes only while some reply's text is fewer than
  `text_lead` tokens ahead of what its Talker has consumed. Text runs ~2x faster than speech; the
  steps that outrun it only take the GPU from the stages that make the audio, and each step the
  Thinker does take serves a larger batch. Text nobody speaks is never held back.
* First-chunk priority (with pacing): text is first made for the replies still waiting for their
  first chunk; once each of them holds the rows that chunk consumes, the others' text waits at a
  lead of one until those frames are made (a batch-64 Talker frame beside a Thinker step takes
  about twice as long).
* One step for everybody: every Thinker step carries a row for every running reply beside the prompt
  pieces it prefills (inside a step that reads every expert anyway, 64 rows cost ~1.5 ms against a
  13-15 ms step of their own), so prompts never starve the replies that speak. Pieces fill the step's
  token budget first come first served, so prompts finish one after another, not abreast.
* The budget is fixed (`max_step_tokens`). Shrinking it while some listener held under a second of
  audio (measured on the H200) starved a wave's prefill, first audio 5.2 s on average against 0.98 s, and
  under steady arrivals left more replies behind, not fewer. A gentle chunk ramp keeps the listeners fed
  instead (docs/performance.md).
* CUDA stream priorities: stages nearer the audio run first (`Stage.stream_priority`).

Holding Code2Wav back for replies far ahead of real time while another awaited its first packet
helped a burst of 64 arrivals, but under steady arrivals (admission control keeps the stages full)
some reply always awaits its first packet, the others sat at the threshold, and a third of the
replies stuttered: it was taken out (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from engine.profile import ChunkConfig, FirstPacketConfig


class PacedText(Protocol):
    """One reply's text as the Thinker sees it."""

    @property
    def paced(self) -> bool:
        """Its text is spoken and its Talker still consumes it."""
        ...

    @property
    def made(self) -> int:
        """Text tokens made so far."""
        ...

    @property
    def spoken(self) -> int:
        """Text rows its Talker has consumed."""
        ...


class FirstPacketPolicy:
    def __init__(self, cfg: FirstPacketConfig, chunks: ChunkConfig) -> None:
        self.text_lead = cfg.text_lead
        # text rows a reply's first audio chunk consumes: one in the Talker's prefill and one per frame
        # (the step that makes frame k takes row k + 1); 0 when chunks are off (no early first packet)
        self.first_chunk_rows = chunks.initial_chunk_frames + 1 if chunks.enabled else 0

    @property
    def paces_text(self) -> bool:
        """The Talker reports what it consumed to the Thinker (`SpeechProgress`)."""
        return self.text_lead > 0

    def thinker_may_decode(self, texts: Iterable[PacedText]) -> bool:
        """Whether a Thinker decode step over these running replies is worth its GPU time now."""
        texts = list(texts)
        if not texts:
            return False
        lead = self.text_lead
        if not lead or any(not t.paced for t in texts):
            return True  # unpaced, or some text that nobody speaks: never held back
        first = self.first_chunk_rows
        if first:
            if any(t.spoken < first and t.made < first for t in texts):
                return True  # a first chunk still needs text
            # a first chunk being made (its Talker has begun) and holding all its text: the others wait
            if any(0 < t.spoken < first for t in texts):
                lead = 1
        return any(t.made - t.spoken < lead for t in texts)

