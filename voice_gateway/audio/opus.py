"""Opus over WebSocket (our Realtime extension): the binary packet header and a session's 24 kHz PCM -> Opus stream.

Each binary WebSocket message carries one 20 ms Opus packet behind a 12-byte header of three big-endian u32:

    offset  size  field
     0      4     sequence       +1 per packet, counted over the whole session, wraps at 2**32
     4      4     timestamp      48 kHz RTP-style, +960 per packet, counted over the whole session, wraps at 2**32
     8      4     sample_offset  where this packet's audio starts in the current response, in 24 kHz samples of
                                 the reply (0, 480, 960, ...; restarts at 0 with each response)
    12      ...   payload        one raw Opus packet, 48 kHz mono, 20 ms; no Ogg or RTP framing around it

A browser decodes them with one `AudioDecoder` per session (`{codec: "opus", sampleRate: 48000,
numberOfChannels: 1}`), each payload an `EncodedAudioChunk` of type "key" at `timestamp * 1e6 / 48000`; its
output lags the PCM by Opus's pre-skip, 312 samples at 48 kHz, the same for every packet."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import av
import numpy as np

from voice_gateway.audio.resample import Resampler

PACKET_HEADER = struct.Struct(">III")  # sequence, timestamp, sample_offset
INPUT_RATE_HZ = 24_000
OPUS_RATE_HZ = 48_000
FRAME_SAMPLES = 960  # 20 ms at 48 kHz: the timestamp step
FRAME_INPUT_SAMPLES = 480  # the same 20 ms at 24 kHz: the sample_offset step
# The encoder's lookahead for the "audio" and "voip" applications: the last 312 samples of a frame only come out of
# the decoder with the next packet.
_LOOKAHEAD_SAMPLES = 312
_U32 = 1 << 32


@dataclass(frozen=True, slots=True)
class OpusPacket:
    sequence: int
    timestamp: int
    sample_offset: int
    payload: bytes

    def pack(self) -> bytes:
        return PACKET_HEADER.pack(self.sequence, self.timestamp, self.sample_offset) + self.payload

    @classmethod
    def unpack(cls, data: bytes) -> OpusPacket:
        """Raises ValueError unless `data` holds the header and at least one payload byte (an Opus packet's TOC)."""
        if len(data) <= PACKET_HEADER.size:
            raise ValueError(f"an Opus message is a {PACKET_HEADER.size}-byte header and a packet; got {len(data)} B")
        sequence, timestamp, sample_offset = PACKET_HEADER.unpack_from(data)
        return cls(sequence, timestamp, sample_offset, bytes(data[PACKET_HEADER.size :]))


class OpusStream:
    """Owns one session's Opus encoder, 24 -> 48 kHz resampler, partial frame and packet counters. Per response:
    `start_response()`, `encode()` as audio arrives (the packets do not depend on its chunking), then `flush()`.
    Sequence and timestamp run on across responses, so the browser keeps one decoder; `start_response()` without a
    `flush()` (a cancelled reply) drops the unsent audio."""

    def __init__(self, bitrate_bps: int = 32_000, *, first_sequence: int = 0, first_timestamp: int = 0) -> None:
        # In process, not a subprocess: a frame's encoding is a small fraction of its 20 ms
        self._encoder = av.CodecContext.create("libopus", "w")
        self._encoder.sample_rate = OPUS_RATE_HZ
        self._encoder.layout = "mono"
        self._encoder.format = "flt"
        self._encoder.bit_rate = bitrate_bps
        # "audio" follows the waveform more closely than "voip", and our input is clean synthetic speech.
        # Unconstrained VBR overshoots its target rate on speech; constrained keeps it. The cutoff stops Opus
        # spending bits on, or folding noise into, the empty band above the
        # 24 kHz input's 12 kHz Nyquist limit.
        self._encoder.options = {"application": "audio", "vbr": "constrained", "cutoff": str(INPUT_RATE_HZ // 2)}
        self._resampler = Resampler(INPUT_RATE_HZ, OPUS_RATE_HZ)
        self._sequence = first_sequence % _U32
        self._timestamp = first_timestamp % _U32
        self._encoded_samples = 0  # the encoder's pts; never wraps
        self.start_response()

    def start_response(self) -> None:
        self._resampler.reset()
        self._pending = np.zeros(0, np.float32)  # 48 kHz samples short of a frame
        self._response_packets = 0
        self._unflushed = False

    def encode(self, samples_24k: np.ndarray) -> list[OpusPacket]:
        """Float32 mono 24 kHz -> the packets of every 20 ms frame completed so far."""
        if samples_24k.ndim != 1:
            raise ValueError(f"expected mono samples of shape (n,), got {samples_24k.shape}")
        if samples_24k.size == 0:
            return []
        self._unflushed = True
        return self._encode_48k(self._resampler.process(samples_24k))

    def flush(self) -> list[OpusPacket]:
        """End the response: the last packets, padded with silence until they carry all of its audio."""
        if not self._unflushed:
            return []
        self._unflushed = False
        tail = self._resampler.flush()
        padding = _LOOKAHEAD_SAMPLES + -(self._pending.size + tail.size + _LOOKAHEAD_SAMPLES) % FRAME_SAMPLES
        return self._encode_48k(np.concatenate([tail, np.zeros(padding, np.float32)]))

    def _encode_48k(self, samples: np.ndarray) -> list[OpusPacket]:
        pending = np.concatenate([self._pending, samples])
        whole = pending.size - pending.size % FRAME_SAMPLES
        self._pending = pending[whole:]
        packets = []
        for start in range(0, whole, FRAME_SAMPLES):
            samples_2d = pending[None, start : start + FRAME_SAMPLES]  # [channels=1, 960]
            frame = av.AudioFrame.from_ndarray(samples_2d, format="flt", layout="mono")
            frame.sample_rate = OPUS_RATE_HZ
            frame.pts = self._encoded_samples
            self._encoded_samples += FRAME_SAMPLES
            packets += [self._next_packet(bytes(packet)) for packet in self._encoder.encode(frame)]
        return packets

    def _next_packet(self, payload: bytes) -> OpusPacket:
        packet = OpusPacket(self._sequence, self._timestamp, self._response_packets * FRAME_INPUT_SAMPLES, payload)
        self._sequence = (self._sequence + 1) % _U32
        self._timestamp = (self._timestamp + FRAME_SAMPLES) % _U32
        self._response_packets += 1
        return packet
