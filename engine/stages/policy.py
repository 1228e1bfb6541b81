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
* Text keeps up with speech through prefills: speech takes a reply's text at one token per codec
  frame (80 ms), and a Thinker decode makes one token for each running reply. So while a running
  reply wants text, a prefill is followed by as many decodes as frames passed from its start to the
  end of the first decode after it (a group of long prompts takes ~120 ms, 1.5 frames: with one
  decode between prefills their replies' text fell behind their speech, and most of them stuttered).
* CUDA stream priorities: stages nearer the audio run first (`STREAM_PRIORITY`).

Holding Code2Wav back for replies far ahead of real time while another awaited its first packet
helped a burst of 64 arrivals, but under steady arrivals (admission control keeps the stages full)
some reply always awaits its first packet, the others sat at the threshold, and a third of the
replies stuttered: it was taken out (docs/performance.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol

from engine.profile import ChunkConfig, FirstPacketConfig

# CUDA stream priority per stage (lower runs first; CUDA offers 0 to -3). A graph replayed on a
# stream runs at that stream's priority.
STREAM_PRIORITY = {"thinker": 0, "talker": -1, "code2wav": -2}


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
    """`frame_s`: the speech one text row becomes (one codec frame); 0 when the model does not speak."""

    def __init__(self, cfg: FirstPacketConfig, chunks: ChunkConfig, frame_s: float = 0.0) -> None:
        self.text_lead = cfg.text_lead
        self.frame_s = frame_s
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

    def decodes_after_prefill(self, cycle_s: float) -> int:
        """Decodes owed to the running replies before the next prefill, for a prefill that took `cycle_s` with
        the first decode after it."""
        return max(1, math.ceil(cycle_s / self.frame_s)) if self.frame_s else 1
