"""The cascade's listening with pocketsphinx: one utterance of 16 kHz mono speech -> its words, the fallback for
Whisper (profile `cascade.ears: pocketsphinx`). The `pocketsphinx` wheel ships its US English acoustic model,
dictionary and language model, so nothing else is installed. Its words are lower case, without punctuation; it
is much weaker than Whisper, and hears a clear voice far better than a robotic one."""

from __future__ import annotations

import importlib.metadata
import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from engine.api import EngineError

log = logging.getLogger(__name__)

SAMPLE_RATE_HZ = 16_000
INSTALL = "pip install pocketsphinx==5.1.1 (the project's assistant-fallbacks extra)"


class SphinxEars:
    """Owns one pocketsphinx decoder. Calls from any threads take turns: the bindings hold the GIL while they decode,
    so a second decoder would not run beside the first. `new_vad` makes a voice-activity detector per call: it keeps
    state, and after speech it judges the first frames of silence speech."""

    def __init__(self, decoder: Any, new_vad: Callable[[], Any]) -> None:
        self._decoder = decoder
        self._new_vad = new_vad
        self._lock = threading.Lock()

    @classmethod
    def load(cls) -> SphinxEars:
        """The decoder over the installed `pocketsphinx` package's models (`EngineError` if it is not installed)."""
        try:
            import pocketsphinx
        except ImportError:
            raise EngineError(f"the pocketsphinx ears need the pocketsphinx package, which is not installed: "
                              f"{INSTALL}") from None
        log.info("pocketsphinx %s, its en-us models from %s", importlib.metadata.version("pocketsphinx"),
                 pocketsphinx.get_model_path())
        decoder = pocketsphinx.Decoder(samprate=SAMPLE_RATE_HZ, loglevel="FATAL")
        # the strictest mode but one: zeros and faint dither have no speech frame, a spoken "yes" a dozen
        return cls(decoder, lambda: pocketsphinx.Vad(pocketsphinx.Vad.MEDIUM_STRICT, SAMPLE_RATE_HZ))

    def transcribe(self, audio: np.ndarray) -> str:
        """One utterance, float32 mono at 16 kHz -> its words, or "" where there is no speech at all."""
        if audio.ndim != 1:
            raise ValueError(f"want mono samples (one axis), got shape {audio.shape}")
        pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes()
        # a muted microphone sends zeros, and pocketsphinx makes a word of them ("dog"); noise it still hears as
        # words, where Whisper hears nothing
        if not self._has_speech(pcm):
            return ""
        with self._lock:
            self._decoder.start_utt()
            self._decoder.process_raw(pcm, full_utt=True)
            self._decoder.end_utt()
            hypothesis = self._decoder.hyp()
        return "" if hypothesis is None else str(hypothesis.hypstr).strip()

    def _has_speech(self, pcm: bytes) -> bool:
        vad = self._new_vad()
        frame = vad.frame_bytes
        return any(vad.is_speech(pcm[start : start + frame]) for start in range(0, len(pcm) - frame + 1, frame))
