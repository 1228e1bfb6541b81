"""PCM16 and container encoding of replies, and decoding of uploaded audio (via libsndfile)."""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

import numpy as np
import soundfile as sf

from voice_gateway.audio.resample import StreamResampler, resample

# OpenAI's `audio.format` names -> soundfile (format, subtype)
_CONTAINERS = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16")}
OUTPUT_FORMATS = ("wav", "pcm16", "flac")


MIN_RATE_HZ, MAX_RATE_HZ = 8_000, 192_000
MAX_CHANNELS = 8
# Decoded a second at a time and mixed down to mono at once: 8 channels at 192 kHz of a 600 s upload
# decoded whole would be 3.7 GB of float32 from a few hundred KB of FLAC; a block is 6 MB at most.
_BLOCK_S = 1


class AudioDecodeError(ValueError):
    code = "invalid_audio"


class AudioTooLong(AudioDecodeError):
    code = "audio_too_long"


@dataclass(frozen=True, slots=True)
class AudioHeader:
    sample_rate_hz: int
    frames: int
    channels: int

    @property
    def duration_s(self) -> float:
        return self.frames / self.sample_rate_hz


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


def _libsndfile_error(fmt: str, e: Exception) -> AudioDecodeError:
    # libsndfile names the file object in its text ("Error opening <_io.BytesIO object at 0x7f...>"):
    # its own reason is all a client needs, and no address of ours leaks
    reason = getattr(e, "error_string", None) or re.sub(r"<[^>]*>", "the upload", str(e))
    return AudioDecodeError(f"could not decode the {fmt} audio: {reason}")


def read_header(data: bytes, fmt: str, *, pcm_rate_hz: int = 24_000) -> AudioHeader:
    """The rate, length and channels that the container declares, without decoding any audio."""
    if fmt == "pcm16":
        return AudioHeader(pcm_rate_hz, len(data) // 2, 1)
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            return AudioHeader(f.samplerate, f.frames, f.channels)
    except (sf.LibsndfileError, RuntimeError, TypeError) as e:
        raise _libsndfile_error(fmt, e) from e


def check_header(header: AudioHeader, max_seconds: float) -> None:
    """Refuse what would be too big to decode: decoding allocates from these numbers, resampling multiplies them."""
    if not MIN_RATE_HZ <= header.sample_rate_hz <= MAX_RATE_HZ:
        raise AudioDecodeError(f"the sample rate {header.sample_rate_hz} Hz is outside "
                               f"{MIN_RATE_HZ}-{MAX_RATE_HZ} Hz")
    if not 1 <= header.channels <= MAX_CHANNELS:
        raise AudioDecodeError(f"{header.channels} channels: at most {MAX_CHANNELS} are accepted")
    if header.duration_s > max_seconds:
        raise AudioTooLong(f"the audio is {header.duration_s:.1f} s long; at most {max_seconds:g} s is accepted")


def decode_audio(data: bytes, fmt: str, *, to_hz: int, max_seconds: float, pcm_rate_hz: int = 24_000) -> np.ndarray:
    """Uploaded audio (wav, mp3, flac, ogg; raw pcm16 at `pcm_rate_hz`) -> mono float32 at `to_hz`; CPU-bound, so off
    the event loop. The header is checked first, and reading stops at `max_seconds` whatever the header claimed."""
    header = read_header(data, fmt, pcm_rate_hz=pcm_rate_hz)
    check_header(header, max_seconds)
    max_frames = int(max_seconds * header.sample_rate_hz)
    if fmt == "pcm16":
        samples = pcm16_to_float(data)
        if samples.size == 0:
            raise AudioDecodeError("the audio is empty")
        return resample(samples, header.sample_rate_hz, to_hz)
    out, frames = StreamResampler(header.sample_rate_hz, to_hz), 0
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            for block in f.blocks(_BLOCK_S * header.sample_rate_hz, dtype="float32", always_2d=True):
                frames += len(block)
                if frames > max_frames:
                    raise AudioTooLong(f"the audio is longer than {max_seconds:g} s")
                out.push(block.mean(axis=1))
    except (sf.LibsndfileError, RuntimeError, TypeError) as e:
        raise _libsndfile_error(fmt, e) from e
    if frames == 0:
        raise AudioDecodeError("the audio is empty")
    return out.finish()
