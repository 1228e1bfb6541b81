"""The cascade's speaking stage: each reply's text, as the Thinker stage decodes it, cut into clauses and spoken by
the voice; owns each speaking reply's text so far, its clause cutter and how much of its audio has left.

It takes the Thinker's payloads as a Talker does and reports to the orchestrator as Code2Wav does. A tool call the
model writes as text is for the client, never spoken. A step speaks one piece of a reply with no audio yet if there
is one, else of the reply whose listener holds the least audio. A clause is one piece (one chunk), but for a reply's
first: its listener holds nothing yet, so its first frames go out as soon as they are made and the rest of the
clause is the next piece."""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from engine.api import SAMPLE_RATE_HZ, AudioChunk
from engine.cascade.clauses import ClauseCutter
from engine.handoff import AudioFinished, Inbox, Report, ThinkerDone, ThinkerPrompt, ThinkerToken
from engine.intake.prompt import TOOL_CALL_END, TOOL_CALL_START
from engine.metrics import EngineMetrics
from engine.omni.runners.sampler import new_seed
from engine.stage import Stage

_CALL = re.compile(re.escape(TOOL_CALL_START) + r".*?(?:" + re.escape(TOOL_CALL_END) + r"\s*|\Z)", re.S)


def speakable(text: str) -> str:
    """A reply's text so far without its tool calls, and without what may yet open one (a trailing `<tool_c`)."""
    text = _CALL.sub("", text)
    for cut in range(min(len(TOOL_CALL_START) - 1, len(text)), 0, -1):
        if TOOL_CALL_START.startswith(text[-cut:]):
            return text[:-cut]
    return text


class Voice(Protocol):
    """What speaks a clause: Piper's voice (engine/cascade/voice.py), or festival's (engine/cascade/festival.py)."""

    def synthesize(self, text: str, seed: int = 0) -> np.ndarray:
        """float32 mono samples at 24 kHz; empty when `text` has nothing speakable."""
        ...

    def stream(self, text: str, seed: int = 0) -> Iterator[np.ndarray]:
        """`synthesize`'s samples in pieces, each made when asked for: joined, they are its samples to within float
        rounding."""
        ...


@dataclass(slots=True)
class Speech:
    request_id: str
    seed: int
    cutter: ClauseCutter = field(default_factory=ClauseCutter)
    tokens: list[int] = field(default_factory=list)
    text: str = ""  # of `tokens`, what went to the cutter
    clauses: deque[str] = field(default_factory=deque)  # cut, not yet spoken
    pieces: Iterator[np.ndarray] | None = None  # the rest of a clause begun, made when taken
    spoken: int = 0  # clauses spoken: the next one's seed is `seed + spoken`
    samples: int = 0  # sent so far
    first_audio_at: float = 0.0  # perf_counter() of its first chunk
    text_done: bool = False
    ended: bool = False  # its last chunk went out, marked last

    def buffered_s(self, now: float) -> float:
        """Audio its listener holds now, if playback began with the first chunk."""
        return self.samples / SAMPLE_RATE_HZ - (now - self.first_audio_at)


class SpeakStage(Stage):
    """Owns the speaking replies; the voice owns its model. `tokenizer` decodes the Thinker's tokens."""

    kind = "speak"

    def __init__(self, voice: Voice, tokenizer: Any, inbox: Inbox, report: Report, metrics: EngineMetrics,
                 device: Any) -> None:
        super().__init__(inbox, report, metrics, device)
        self.voice = voice
        self.tokenizer = tokenizer
        self.speeches: dict[str, Speech] = {}

    def accept(self, item: Any) -> None:
        if isinstance(item, ThinkerPrompt):
            self.speeches[item.request_id] = Speech(item.request_id, new_seed(item.seed))
            return
        speech = self.speeches.get(item.request_id)
        if speech is None:  # aborted meanwhile, or rows this stage has no use for
            return
        if isinstance(item, ThinkerToken):
            speech.tokens.append(item.token_id)
            text = self.tokenizer.decode(speech.tokens, skip_special_tokens=True)
            if not text.endswith("\ufffd"):  # a character still split across tokens waits for the rest
                said = speakable(text)
                speech.clauses.extend(speech.cutter.feed(said[len(speech.text) :]))
                speech.text = said
        elif isinstance(item, ThinkerDone):
            speech.clauses.extend(speech.cutter.flush())
            speech.text_done = True

    def release(self, request_id: str) -> None:
        self.speeches.pop(request_id, None)

    def has_work(self) -> bool:
        return any(s.clauses or s.pieces is not None or s.text_done for s in self.speeches.values())

    def num_waiting(self) -> int:
        return sum(1 for s in self.speeches.values() if not s.samples)

    def num_running(self) -> int:
        return len(self.speeches)

    def step(self) -> list[str]:
        now = time.perf_counter()
        for speech in [s for s in self.speeches.values() if s.text_done and not s.clauses and s.pieces is None]:
            self._finish(speech)  # its last clause is out (or it said nothing speakable)
        ready = [s for s in self.speeches.values() if s.clauses or s.pieces is not None]
        if not ready:
            self.last_batch = []
            return []
        speech = min(ready, key=lambda s: (s.samples > 0, s.buffered_s(now)))
        self.last_batch, self.last_phase = [speech.request_id], "decode"
        audio = self._next_piece(speech)
        last = speech.text_done and not speech.clauses and speech.pieces is None
        if audio.size:
            if not speech.samples:
                speech.first_audio_at = time.perf_counter()
            self.report(AudioChunk(speech.request_id, audio, speech.samples, is_last=last))
            speech.samples += audio.size
            speech.ended = last
        if last:
            self._finish(speech)
        return self.last_batch

    def _next_piece(self, speech: Speech) -> np.ndarray:
        """The rest of the clause begun, or the next clause: in pieces while its listener holds no audio, else whole."""
        if speech.pieces is not None:
            piece = next(speech.pieces, None)
            if piece is not None:
                return piece
            speech.pieces = None  # its clause was all out
            if not speech.clauses:
                return np.zeros(0, np.float32)
        clause, seed = speech.clauses.popleft(), speech.seed + speech.spoken
        speech.spoken += 1
        if speech.samples:
            return self.voice.synthesize(clause, seed=seed)
        speech.pieces = self.voice.stream(clause, seed=seed)
        return next(speech.pieces, np.zeros(0, np.float32))

    def _finish(self, speech: Speech) -> None:
        self.speeches.pop(speech.request_id, None)
        # its last clause's last piece went out before the stream found it had no more, its last clause had nothing
        # speakable, or it said nothing at all
        if not speech.ended:
            self.report(AudioChunk(speech.request_id, np.zeros(0, np.float32), speech.samples, is_last=True))
        self.report(AudioFinished(speech.request_id, codec_frames=0))
