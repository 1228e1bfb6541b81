"""PCM16 and container encoding of replies, and decoding of uploaded audio (via libsndfile)."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf

from voice_gateway.audio.resample import resample

# OpenAI's `audio.format` names -> soundfile (format, subtype)
_CONTAINERS = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16")}
OUTPUT_FORMATS = ("wav", "pcm16", "flac")


class AudioDecodeError(ValueError):
    pass


def float_to_pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def pcm16_to_float(data: bytes) -> np.ndarray:
    if len(data) % 2:
        raise AudioDecodeError("PCM16 data has an odd number of bytes")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def encode_audio(samples: np.ndarray, sample_rate_hz: int, fmt: str) -> bytes:
    if fmt == "pcm16":
        return float_to_pcm16(samples)
    container, subtype = _CONTAINERS[fmt]
    buf = io.BytesIO()
    sf.write(buf, np.clip(samples, -1.0, 1.0), sample_rate_hz, format=container, subtype=subtype)
    return buf.getvalue()


def decode_audio(data: bytes, fmt: str, *, to_hz: int, pcm_rate_hz: int = 24_000) -> np.ndarray:
    """Uploaded audio (wav, mp3, flac, ogg; raw pcm16 at `pcm_rate_hz`) -> mono float32 at `to_hz`."""
    if fmt == "pcm16":
        samples, rate = pcm16_to_float(data), pcm_rate_hz
    else:
        try:
            samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
        except (sf.LibsndfileError, RuntimeError, TypeError) as e:
            raise AudioDecodeError(f"could not decode the {fmt} audio: {e}") from e
        samples = samples.mean(axis=1)
    if samples.size == 0:
        raise AudioDecodeError("the audio is empty")
    return resample(samples, rate, to_hz)
