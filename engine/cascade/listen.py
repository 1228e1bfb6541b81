"""The cascade's listening, at the front door: chat messages -> the language model's prompt, each clip of user speech
turned into its words by the ears first; owns the transcripts of recent clips. The prompt is then built as any
text prompt is (SmolLM2 speaks Qwen's ChatML turns). A conversation sends its earlier turns' audio every turn, so
each clip's transcript is kept by the clip's digest and only the new turn is heard."""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from engine.api import AudioPart, Message, TextPart, Tool
from engine.handoff import Transcript
from engine.intake.prompt import Prompt, PromptBuilder

RECENT_CLIPS = 256
# what a reply of a small model sounds best as: short, and words a voice can say
VOICE_SYSTEM_PROMPT = ("You are a helpful voice assistant. Answer in one or two short sentences of plain spoken "
                       "English, with no lists, markup or emoji.")


class Ears(Protocol):
    """What hears a clip: Whisper (engine/cascade/ears.py), or pocketsphinx (engine/cascade/sphinx.py)."""

    def transcribe(self, audio: np.ndarray) -> str:
        """One utterance, float32 mono at 16 kHz -> its words, or "" for silence."""
        ...


class ListeningPrompts:
    """`builder`: the text prompt builder over the language model's tokenizer; `ears`: who transcribes."""

    def __init__(self, builder: PromptBuilder, ears: Ears, system: str = VOICE_SYSTEM_PROMPT) -> None:
        self.builder = builder
        self.ears = ears
        self.system = system
        self._recent: OrderedDict[bytes, str] = OrderedDict()
        self._lock = threading.Lock()  # builds run in threads

    @property
    def tokenizer(self) -> Any:
        return self.builder.tokenizer

    def build(self, messages: tuple[Message, ...], tools: tuple[Tool, ...] = ()) -> Prompt:
        """Tools are described as Qwen describes them (engine/intake/prompt.py); a 135M model rarely calls one unasked,
        and a `tool_choice` that requires a call is kept to by its grammar."""
        started = time.perf_counter()
        heard = tuple(self._heard(m) for m in messages)
        took = time.perf_counter() - started
        if not heard or heard[0].role != "system":
            heard = (Message("system", (TextPart(self.system),)), *heard)
        prompt = self.builder.build(heard, tools)
        if not messages or not any(isinstance(p, AudioPart) for p in messages[-1].content):
            return prompt
        # the last message's clips, as heard: the parts that stand where its audio stood
        words = [h.text for p, h in zip(messages[-1].content, heard[-1].content, strict=True)
                 if isinstance(p, AudioPart) and isinstance(h, TextPart)]
        return replace(prompt, heard=Transcript(" ".join(filter(None, words)), took))

    def transcript(self, clip: AudioPart) -> str:
        key = hashlib.blake2b(clip.samples.tobytes(), digest_size=16).digest()
        with self._lock:
            if (text := self._recent.get(key)) is not None:
                self._recent.move_to_end(key)
                return text
        text = self.ears.transcribe(clip.samples)
        with self._lock:
            self._recent[key] = text
            if len(self._recent) > RECENT_CLIPS:
                self._recent.popitem(last=False)
        return text

    def _heard(self, message: Message) -> Message:
        if not any(isinstance(p, AudioPart) for p in message.content):
            return message
        parts = tuple(TextPart(self.transcript(p)) if isinstance(p, AudioPart) else p for p in message.content)
        return replace(message, content=parts)
