"""Audio that would decode to far more than its size, sent to the real server: a WAV header that claims 1 Hz
(resampled to 16 kHz, each byte of it would become 32,000 bytes of samples) is refused with a 400, and the
server's peak RSS does not grow past a generous bound while it refuses a stream of them."""

from __future__ import annotations

import base64
import struct

import httpx

from tests.conftest import Server
from tests.reliability.hostile import assert_openai_error, memory_kib, reset_peak_rss

MAX_GROWTH_MIB = 128  # 300 KB of 1 Hz samples would resample to ~9.6 GB


def _wav(sample_rate_hz: int, channels: int, bits: int, data_bytes: int, claimed_bytes: int | None = None) -> bytes:
    """A PCM WAV whose header says what we like (`claimed_bytes` of data), followed by `data_bytes` of zeros."""
    claimed = data_bytes if claimed_bytes is None else claimed_bytes
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", 1, channels, sample_rate_hz, sample_rate_hz * block, block, bits)
    return (b"RIFF" + struct.pack("<I", min(36 + claimed, 2**32 - 1)) + b"WAVE" + b"fmt " + struct.pack("<I", 16)
            + fmt + b"data" + struct.pack("<I", claimed) + bytes(data_bytes))


AMPLIFIERS = [
    _wav(1, 1, 16, 300_000),
    _wav(1, 2, 8, 300_000),
    _wav(7_999, 1, 16, 300_000),  # just under the lowest rate taken
    _wav(1, 1, 16, 4_000, claimed_bytes=2**32 - 64),  # a data chunk of 4 GB, of which 4 KB came
]


def _refuse(client: httpx.Client, audio: bytes) -> None:
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(audio).decode(), "format": "wav"}}
    reply = client.post("/v1/chat/completions", json={
        "model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                                                                      part]}]})
    assert reply.status_code == 400, reply.text[:500]
    assert_openai_error(reply.json())
    assert reply.json()["error"]["code"] in ("invalid_audio", "audio_too_long"), reply.json()


def test_audio_that_claims_1_hz_is_refused_in_bounded_memory(server: Server) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        for audio in AMPLIFIERS:  # warm: whatever the first refusal loads stays loaded
            _refuse(client, audio)
        reset_peak_rss(server.pid)
        before_kib = memory_kib(server.pid, "VmRSS")
        for _ in range(5):
            for audio in AMPLIFIERS:
                _refuse(client, audio)
        growth_mib = (memory_kib(server.pid, "VmHWM") - before_kib) / 1024
    assert growth_mib < MAX_GROWTH_MIB, f"peak RSS grew by {growth_mib:.0f} MiB refusing {len(AMPLIFIERS) * 5} bodies"
