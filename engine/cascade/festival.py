"""Text -> speech with Debian's festival and its HTS voice `cmu_us_slt_arctic_hts` (package festvox-us-slt-hts): the
fallback for the Piper voice (profile `cascade.voice: festival`); owns where festival's `text2wave` is. Each clause
is one `text2wave` process writing a 32 kHz WAV, resampled to 24 kHz; a process keeps nothing between clauses, so
a clause's samples depend on its text alone."""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from engine.api import SAMPLE_RATE_HZ, EngineError

log = logging.getLogger(__name__)

VOICE = "cmu_us_slt_arctic_hts"
SPEAKER = "slt"
INSTALL = "apt-get install festival festvox-us-slt-hts"
_TIMEOUT_S = 30.0


class FestivalVoice:
    """Text -> float32 mono speech at 24 kHz, one `text2wave` process per call. Owns the path of `text2wave`; calls
    may overlap (each is a process of its own). HTS draws no noise, so the seed changes nothing."""

    def __init__(self, text2wave: Path) -> None:
        self.text2wave = text2wave

    @classmethod
    def load(cls) -> FestivalVoice:
        """Festival's `text2wave`, its voice checked by speaking one word (`EngineError` naming the install command)."""
        found = shutil.which("text2wave")
        if found is None:
            raise EngineError(f"the festival voice needs Debian's festival, which is not installed: {INSTALL}")
        voice = cls(Path(found))
        voice.synthesize("Ready.")
        log.info("festival's %s voice, through %s", VOICE, found)
        return voice

    def synthesize(self, text: str, seed: int = 0) -> np.ndarray:
        """float32 mono samples at 24 kHz; empty when `text` has nothing speakable. `seed` >= 0."""
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        # festival's lexicon is English in ASCII: it reads other bytes as Latin-1 letters, and a clause of emoji
        # alone is a Scheme error, so accents are folded away and the rest dropped
        ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
        if not any(char.isalnum() for char in ascii_text):
            return np.zeros(0, dtype=np.float32)
        with tempfile.TemporaryDirectory(prefix="festival-") as folder:
            wav = Path(folder) / "clause.wav"
            try:
                done = subprocess.run(
                    [str(self.text2wave), "-eval", f"(voice_{VOICE})", "-o", str(wav)],
                    input=ascii_text.encode("ascii"), capture_output=True, timeout=_TIMEOUT_S, check=False)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise EngineError(f"festival could not speak a clause: {e}") from e
            # an unknown voice is "SIOD ERROR: unbound variable" on stderr, exit status 0 and no file
            error = done.stderr.decode("utf-8", "replace").strip()
            if done.returncode != 0 or "SIOD ERROR" in error or not wav.is_file():
                raise EngineError(f"festival could not speak {ascii_text!r} with {VOICE} (exit status "
                                  f"{done.returncode}): {error[-300:] or 'no output'}; is its voice installed? "
                                  f"{INSTALL}")
            audio, rate = sf.read(wav, dtype="float32")
        if audio.size == 0:
            return np.zeros(0, dtype=np.float32)
        audio = soxr.resample(audio, rate, SAMPLE_RATE_HZ, quality="HQ")
        return np.clip(audio, -1.0, 1.0).astype(np.float32, copy=False)

    def stream(self, text: str, seed: int = 0) -> Iterator[np.ndarray]:
        """`synthesize`'s samples as one piece, none when nothing is speakable: a process makes a clause whole."""
        audio = self.synthesize(text, seed)
        if audio.size:
            yield audio
