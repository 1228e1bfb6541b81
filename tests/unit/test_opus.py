"""OpusStream: a real libopus decoder gets the input back; chunking, counters across responses, the wire header."""

from __future__ import annotations

import subprocess
from itertools import cycle

import av
import numpy as np
import pytest
import soundfile as sf

from voice_gateway.audio.opus import PACKET_HEADER, OpusPacket, OpusStream
from voice_gateway.audio.resample import resample

RATE_HZ = 24_000
PRE_SKIP = 156  # Opus's 312-sample decoder delay at 48 kHz, in 24 kHz samples
CHUNK_SIZES = (1, 7, 480, 5000)


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    wav = tmp_path_factory.mktemp("speech") / "speech.wav"
    subprocess.run(["espeak-ng", "-w", str(wav), "Hello there, how are you doing today?"], check=True)
    samples, rate = sf.read(wav, dtype="float32")
    return resample(samples, rate, RATE_HZ)


def _sweep(samples: int = 2 * RATE_HZ) -> np.ndarray:
    """100 Hz -> 8 kHz at -10 dBFS, cut off at full level so that a lost tail would show."""
    t = np.arange(samples) / RATE_HZ
    f0_hz, f1_hz = 100.0, 8000.0
    return (0.3 * np.sin(2 * np.pi * (f0_hz * t + (f1_hz - f0_hz) / (2 * t.size / RATE_HZ) * t**2))).astype(np.float32)


def _encode(stream: OpusStream, samples: np.ndarray, sizes: tuple[int, ...] = CHUNK_SIZES) -> list[OpusPacket]:
    packets, start = [], 0
    for size in cycle(sizes):
        if start >= samples.size:
            break
        packets += stream.encode(samples[start : start + size])
        start += size
    return packets + stream.flush()


def _decode(packets: list[OpusPacket]) -> np.ndarray:
    """One decoder for the whole session, as the browser keeps one; 48 kHz out, back to 24 kHz."""
    decoder = av.CodecContext.create("libopus", "r")
    decoder.sample_rate = 48_000
    decoder.layout = "mono"
    frames = [frame.to_ndarray().reshape(-1) for p in packets for frame in decoder.decode(av.Packet(p.payload))]
    pcm = np.concatenate(frames)
    scale = 32768.0 if pcm.dtype == np.int16 else 1.0
    return resample(pcm.astype(np.float32) / scale, 48_000, RATE_HZ)


def _delay(reference: np.ndarray, decoded: np.ndarray) -> int:
    size = reference.size + decoded.size
    correlation = np.fft.irfft(np.fft.rfft(decoded, size) * np.conj(np.fft.rfft(reference, size)), size)
    return int(np.argmax(correlation[:2000]))


def _snr_db(reference: np.ndarray, decoded: np.ndarray) -> float:
    error = decoded.astype(np.float64) - reference
    return float(10 * np.log10(np.sum(reference.astype(np.float64) ** 2) / np.sum(error**2)))


def test_one_decoder_gets_both_responses_back(speech: np.ndarray) -> None:
    # 64 kbps: there Opus codes in CELT, which follows the waveform; see the next test for the default
    stream = OpusStream(bitrate_bps=64_000)
    signals = [speech, _sweep()]
    responses = []
    for signal in signals:
        stream.start_response()
        responses.append(_encode(stream, signal))
    decoded = _decode([p for packets in responses for p in packets])
    assert _delay(speech, decoded) == PRE_SKIP
    for signal, packets in zip(signals, responses, strict=True):
        start = packets[0].timestamp // 2 + PRE_SKIP
        assert decoded.size >= start + signal.size  # flush() carried the whole tail out
        assert _snr_db(signal, decoded[start : start + signal.size]) >= 20


def test_default_bitrate_keeps_speech(speech: np.ndarray) -> None:
    # At 32 kbps Opus codes speech in hybrid mode, whose SILK layer (below 8 kHz) matches the waveform only
    # roughly: 17.6 dB measured, perceptually fine. Its SILK path runs one 48 kHz sample early.
    decoded = _decode(_encode(OpusStream(), speech))
    delay = _delay(speech, decoded)
    assert delay in (PRE_SKIP - 1, PRE_SKIP)
    assert _snr_db(speech, decoded[delay : delay + speech.size]) >= 15


def test_chunking_does_not_change_a_bit(speech: np.ndarray) -> None:
    signal = np.concatenate([speech, _sweep(RATE_HZ)])
    whole = _encode(OpusStream(), signal, (signal.size,))
    assert _encode(OpusStream(), signal) == whole
    assert _encode(OpusStream(), signal, (480,)) == whole


def test_counters_across_responses() -> None:
    stream = OpusStream()
    lengths = (RATE_HZ, 12_345)
    responses = []
    for length in lengths:
        stream.start_response()
        responses.append(_encode(stream, _sweep(length)))
    for length, packets in zip(lengths, responses, strict=True):
        # every input sample plus the encoder's 312-sample lookahead, in whole 960-sample frames
        assert len(packets) == -(-(2 * length + 312) // 960)
        assert [p.sample_offset for p in packets] == [480 * i for i in range(len(packets))]
    every = [p for packets in responses for p in packets]
    assert [p.sequence for p in every] == list(range(len(every)))
    assert [p.timestamp for p in every] == [960 * i for i in range(len(every))]


def test_sequence_and_timestamp_wrap_at_2_to_the_32() -> None:
    stream = OpusStream(first_sequence=2**32 - 2, first_timestamp=2**32 - 960)
    packets = _encode(stream, _sweep(RATE_HZ // 10))
    assert [p.sequence for p in packets[:4]] == [2**32 - 2, 2**32 - 1, 0, 1]
    assert [p.timestamp for p in packets[:4]] == [2**32 - 960, 0, 960, 1920]
    assert [OpusPacket.unpack(p.pack()) for p in packets] == packets


def test_flush_sends_nothing_without_new_audio() -> None:
    stream = OpusStream()
    assert stream.flush() == []
    assert stream.encode(np.zeros(0, np.float32)) == []
    assert _encode(stream, _sweep(RATE_HZ // 10)) != []
    assert stream.flush() == []
    assert stream.encode(_sweep(240)) == []  # under one frame: held back
    stream.start_response()  # a cancelled response drops it
    assert stream.flush() == []


def test_header_bytes() -> None:
    packet = OpusPacket(sequence=1, timestamp=960, sample_offset=480, payload=b"\xfc\xff\xfe")
    assert PACKET_HEADER.size == 12
    assert packet.pack() == bytes.fromhex("00000001 000003c0 000001e0 fcfffe")
    assert OpusPacket.unpack(packet.pack()) == packet
    big = OpusPacket(sequence=0xDEADBEEF, timestamp=2**32 - 1, sample_offset=0, payload=b"\x08")
    assert big.pack() == bytes.fromhex("deadbeef ffffffff 00000000 08")
    assert OpusPacket.unpack(big.pack()) == big


@pytest.mark.parametrize("data", [b"", b"\x00" * 11, b"\x00" * 12])
def test_unpack_rejects_short_messages(data: bytes) -> None:
    with pytest.raises(ValueError, match="12-byte header"):
        OpusPacket.unpack(data)


def test_encode_rejects_non_mono_input() -> None:
    with pytest.raises(ValueError, match="mono"):
        OpusStream().encode(np.zeros((2, 480), np.float32))
