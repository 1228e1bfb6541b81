"""The spoken questions the bench sends (16-bit PCM WAV files, benchmarks/voice/ by default): as 24 kHz PCM16 for
realtime `input_audio_buffer.append`, and as the file itself for chat's `input_audio`."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from bench.config import BenchError
from bench.measure import BYTES_PER_SAMPLE, SAMPLE_RATE


@dataclass(frozen=True, slots=True)
class Question:
    name: str  # the file's stem
    wav: bytes  # the file as it is: chat's input_audio carries it base64, format "wav"
    pcm16: bytes  # mono 16-bit little-endian at 24 kHz, the realtime protocol's input format

    @property
    def duration_s(self) -> float:
        return len(self.pcm16) / BYTES_PER_SAMPLE / SAMPLE_RATE


def question_files(path: Path) -> list[Path]:
    """`path` itself, or the *.wav files in it (sorted, so that runs send the same order)."""
    files = sorted(path.glob("*.wav")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise BenchError(f"{path}: no WAV files there")
    return files


def load_question(path: Path) -> Question:
    """A 16-bit PCM WAV (any rate, channels mixed down) as a Question; BenchError if it is anything else."""
    wav = path.read_bytes()
    try:
        with sf.SoundFile(io.BytesIO(wav)) as f:
            if (f.format, f.subtype) != ("WAV", "PCM_16"):
                raise BenchError(f"{path}: expected 16-bit PCM WAV, got {f.format} {f.subtype}")
            rate, samples = f.samplerate, f.read(dtype="float32", always_2d=True).mean(axis=1)
    except (sf.LibsndfileError, RuntimeError) as exc:
        raise BenchError(f"{path}: not a WAV file ({exc})") from exc
    if samples.size == 0:
        raise BenchError(f"{path}: no audio")
    at_24k = soxr.resample(samples, rate, SAMPLE_RATE) if rate != SAMPLE_RATE else samples
    pcm16 = (np.clip(at_24k, -1.0, 1.0) * 32767).astype("<i2").tobytes()
    return Question(path.stem, wav, pcm16)


def load_questions(path: Path) -> list[Question]:
    return [load_question(f) for f in question_files(path)]
