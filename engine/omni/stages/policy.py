"""First-packet priority in one place: what waits, and for how long, so that a reply's first audio comes early.

A reply is heard from its first audio chunk on, so while some reply waits for that chunk, work for replies already
speaking (or text far ahead of its speech) only takes the GPU from it. Text pacing (`text_lead` > 0): the Thinker
decodes only while some spoken reply's text is fewer than `text_lead` tokens ahead of what its Talker consumed; text
outruns speech, and steps it takes without need leave the audio stages less GPU. First-chunk priority (with pacing):
text is first made for the replies still waiting for their first chunk; once each holds the rows that chunk
consumes, the others' text waits at a lead of one until those frames are made. Every Thinker step carries a row for
every running reply beside the prompt pieces it prefills, so prompts never starve speaking replies. Pieces fill the
fixed `max_step_tokens` in two passes (`finishing_share`): prompts that finish within half of the room first, then
the others first come first served, so that a turn of a few dozen tokens does not wait behind another call's history
prefilled again. The budget stays fixed: shrinking it while listeners are short of audio starves a wave's prefill
and leaves more replies behind, which a gentle chunk ramp avoids. Stages nearer the audio get higher CUDA stream
priority. Code2Wav is never held back for replies far ahead of real time: under steady arrivals some reply always
awaits its first packet, and the others would stutter at the threshold."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from engine.profile import ChunkConfig, FirstPacketConfig


def finishing_share(room: int) -> int:
    """Of a step's room for prompt pieces, what prompts that finish in it may take, in the order they came, before
    earlier prompts that do not. A reply begins only once its whole prompt is in, so a short prompt held behind a
    long one's pieces waits the long one's steps for nothing; the other half keeps the first long prompt moving by
    at least half a step each step, whatever arrives, so none starves."""
    return room // 2


class PacedText(Protocol):
    """One reply's text as the Thinker sees it."""

    @property
    def paced(self) -> bool:
        """Its text is spoken and its Talker still consumes it."""
        ...

    @property
    def made(self) -> int:
        ...

    @property
    def spoken(self) -> int:
        ...


class FirstPacketPolicy:
    def __init__(self, cfg: FirstPacketConfig, chunks: ChunkConfig) -> None:
        self.text_lead = cfg.text_lead
        # text rows a reply's first audio chunk consumes: one in the Talker's prefill and one per frame
        # (the step that makes frame k takes row k + 1); 0 when chunks are off (no early first packet)
        self.first_chunk_rows = chunks.initial_chunk_frames + 1 if chunks.enabled else 0

    @property
    def paces_text(self) -> bool:
        return self.text_lead > 0

    def thinker_may_decode(self, texts: Iterable[PacedText]) -> bool:
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

