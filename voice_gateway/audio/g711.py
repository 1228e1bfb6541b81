"""G.711 µ-law and A-law (8 kHz, the Realtime API's `g711_ulaw` / `g711_alaw`): byte codes <-> float32 samples.
The arithmetic is the public-domain Sun reference's (`g711.c`) over 16-bit linear PCM, matching `audioop` (gone in
Python 3.13) bit for bit on all inputs and codes."""

from __future__ import annotations

import numpy as np

G711_SAMPLE_RATE_HZ = 8_000

_ULAW_BIAS = 0x84  # 132: shifts every µ-law segment to start on a power of two
_ULAW_SEGMENT_ENDS = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])  # on (14-bit magnitude + 33)
_ALAW_SEGMENT_ENDS = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])  # on 13-bit magnitude
_ALAW_EVEN_BITS = 0x55  # A-law inverts every other bit on the line


def _ulaw_to_pcm16(codes: np.ndarray) -> np.ndarray:
    inverted = ~codes.astype(np.int32) & 0xFF
    magnitude = (((inverted & 0x0F) << 3) + _ULAW_BIAS) << ((inverted >> 4) & 0x07)
    return np.where(inverted & 0x80, _ULAW_BIAS - magnitude, magnitude - _ULAW_BIAS).astype(np.int16)


def _alaw_to_pcm16(codes: np.ndarray) -> np.ndarray:
    toggled = codes.astype(np.int32) ^ _ALAW_EVEN_BITS
    segment = (toggled >> 4) & 0x07
    mantissa = (toggled & 0x0F) << 4
    magnitude = np.where(segment == 0, mantissa + 8, (mantissa + 0x108) << np.maximum(segment - 1, 0))
    return np.where(toggled & 0x80, magnitude, -magnitude).astype(np.int16)


_ALL_CODES = np.arange(256, dtype=np.uint8)
_ULAW_TABLE = _ulaw_to_pcm16(_ALL_CODES).astype(np.float32) / 32768.0
_ALAW_TABLE = _alaw_to_pcm16(_ALL_CODES).astype(np.float32) / 32768.0


def _to_pcm16(samples: np.ndarray) -> np.ndarray:
    return (np.clip(samples, -1.0, 32767 / 32768) * 32768.0).round().astype(np.int32)


def ulaw_encode(samples: np.ndarray) -> bytes:
    """Float32 in [-1, 1] (8 kHz) -> one µ-law byte per sample; values outside are clipped."""
    pcm14 = _to_pcm16(samples) >> 2
    mask = np.where(pcm14 < 0, 0x7F, 0xFF)
    # The reference clips at 8159 and maps the one value past the last segment to 0x7F, the top code; capping at
    # the last segment's end gives that same code.
    biased = np.minimum(np.abs(pcm14) + (_ULAW_BIAS >> 2), _ULAW_SEGMENT_ENDS[-1])
    segment = np.searchsorted(_ULAW_SEGMENT_ENDS, biased)
    code = (segment << 4) | ((biased >> (segment + 1)) & 0x0F)
    return (code ^ mask).astype(np.uint8).tobytes()


def alaw_encode(samples: np.ndarray) -> bytes:
    """Float32 in [-1, 1] (8 kHz) -> one A-law byte per sample; values outside are clipped."""
    pcm13 = _to_pcm16(samples) >> 3
    mask = np.where(pcm13 >= 0, 0xD5, _ALAW_EVEN_BITS)  # sign bit set for positive, then the even-bit toggle
    magnitude = np.where(pcm13 >= 0, pcm13, -pcm13 - 1)
    segment = np.searchsorted(_ALAW_SEGMENT_ENDS, magnitude)  # a 13-bit magnitude never passes the last end
    code = (segment << 4) | ((magnitude >> np.maximum(segment, 1)) & 0x0F)
    return (code ^ mask).astype(np.uint8).tobytes()


def ulaw_decode(data: bytes) -> np.ndarray:
    """µ-law bytes -> float32 samples in [-1, 1), one per byte."""
    return _ULAW_TABLE[np.frombuffer(data, dtype=np.uint8)]


def alaw_decode(data: bytes) -> np.ndarray:
    """A-law bytes -> float32 samples in [-1, 1), one per byte."""
    return _ALAW_TABLE[np.frombuffer(data, dtype=np.uint8)]
