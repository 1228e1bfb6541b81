"""G.711 µ-law / A-law: ITU reference values, exact code round trips, error bounds and a sine's SNR."""

from __future__ import annotations

import numpy as np
import pytest

from voice_gateway.audio.g711 import G711_SAMPLE_RATE_HZ, alaw_decode, alaw_encode, ulaw_decode, ulaw_encode

CODECS = {"ulaw": (ulaw_encode, ulaw_decode), "alaw": (alaw_encode, alaw_decode)}

# G.711 decoder outputs (14-bit µ-law values x4, 13-bit A-law values x8, as in the 16-bit reference code).
ITU_VALUES = {
    "ulaw": {0x80: 32124, 0x00: -32124, 0xFF: 0, 0x7F: 0, 0xF0: 120, 0xD5: 716, 0xAA: 5372, 0x2A: -5372},
    "alaw": {0xD5: 8, 0x55: -8, 0xAA: 32256, 0x2A: -32256, 0x80: 5504, 0xFF: 848, 0x7F: -848},
}
IDLE_CODE = {"ulaw": 0xFF, "alaw": 0xD5}


@pytest.mark.parametrize("law", CODECS)
def test_decodes_the_itu_values(law: str) -> None:
    _, decode = CODECS[law]
    codes = list(ITU_VALUES[law])
    decoded = decode(bytes(codes))
    assert decoded.dtype == np.float32
    assert (decoded * 32768).round().astype(int).tolist() == [ITU_VALUES[law][c] for c in codes]


@pytest.mark.parametrize("law", CODECS)
def test_every_code_survives_decode_then_encode(law: str) -> None:
    encode, decode = CODECS[law]
    codes = bytes(range(256))
    again = encode(decode(codes))
    # µ-law has a negative zero (0x7F); it comes back as the positive one
    assert [(c, a) for c, a in zip(codes, again, strict=True) if c != a] == ([(0x7F, 0xFF)] if law == "ulaw" else [])


@pytest.mark.parametrize("law", CODECS)
def test_silence_is_the_idle_code_and_loud_input_clips(law: str) -> None:
    encode, decode = CODECS[law]
    assert encode(np.zeros(4, np.float32)) == bytes([IDLE_CODE[law]]) * 4
    top = ITU_VALUES[law][0x80 if law == "ulaw" else 0xAA] / 32768
    assert decode(encode(np.array([5.0, -5.0], np.float32))).tolist() == [top, -top]


@pytest.mark.parametrize("law", CODECS)
def test_round_trip_error_is_a_fraction_of_the_level(law: str) -> None:
    encode, decode = CODECS[law]
    samples = np.linspace(-1.0, 1.0, 200_001, dtype=np.float32)
    error = np.abs(decode(encode(samples)) - samples)
    # 16 steps per doubling of level: at most half a step (1/32 of the level) plus the smallest step near zero
    bound = np.abs(samples) / 32 + 16 / 32768
    assert np.all(error <= bound)
    assert (error / bound).max() > 0.9  # and the bound is tight


@pytest.mark.parametrize("law", CODECS)
@pytest.mark.parametrize("level_dbfs", [-3, -10, -30])
def test_sine_snr(law: str, level_dbfs: int) -> None:
    encode, decode = CODECS[law]
    t = np.arange(G711_SAMPLE_RATE_HZ) / G711_SAMPLE_RATE_HZ
    sine = (10 ** (level_dbfs / 20) * np.sin(2 * np.pi * 1004 * t)).astype(np.float32)
    decoded = decode(encode(sine))
    snr_db = 10 * np.log10(np.sum(sine.astype(np.float64) ** 2) / np.sum((decoded - sine).astype(np.float64) ** 2))
    # companding keeps SNR nearly flat over level (~38 dB); linear 8-bit would lose 20 dB from -10 to -30 dBFS
    assert snr_db >= 30, snr_db


def test_empty_input() -> None:
    for encode, decode in CODECS.values():
        assert encode(np.zeros(0, np.float32)) == b""
        assert decode(b"").shape == (0,)
