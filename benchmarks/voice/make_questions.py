"""Speaks the realtime benchmark's questions with espeak-ng into benchmarks/voice/*.wav (run once; the WAVs are committed).

Each file is one question, 16-bit PCM mono at 16 kHz (the engine's input rate; the bench resamples to the realtime
protocol's 24 kHz when it sends), with espeak-ng's leading and trailing silence trimmed so that a file ends where
the speech does. Run from the repo root: `python benchmarks/voice/make_questions.py` (needs espeak-ng).
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

QUESTIONS = {
    "weather": "What is the weather going to be like in Paris this afternoon?",
    "book": "Can you recommend a good book for a long flight to Tokyo?",
    "egg": "How long should I boil an egg if I want the yolk to stay soft?",
    "sunset": "What time does the sun set this evening, and is it going to rain?",
}
RATE_HZ = 16_000
VOICE = "en-us"
SILENCE_LEVEL = 0.01  # of full scale: below it, espeak-ng's lead-in and tail are silence
MARGIN_S = 0.05  # kept either side of the speech, so no onset or decay is cut


def speak(text: str) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-v", VOICE, "-w", str(path), text], check=True)
        samples, rate = sf.read(path, dtype="float32")
    samples = soxr.resample(samples, rate, RATE_HZ)
    loud = np.flatnonzero(np.abs(samples) > SILENCE_LEVEL)
    margin = int(MARGIN_S * RATE_HZ)
    return samples[max(loud[0] - margin, 0) : loud[-1] + margin]


def main() -> None:
    out_dir = Path(__file__).resolve().parent
    for name, text in QUESTIONS.items():
        samples = speak(text)
        sf.write(out_dir / f"{name}.wav", samples, RATE_HZ, subtype="PCM_16")
        print(f"{name}.wav: {len(samples) / RATE_HZ:.2f} s  {text!r}")


if __name__ == "__main__":
    main()
