"""A session's way in for audio: the input buffer and the turn detection that cuts it into user turns.

Both run on one clock (ms of audio since the first append), so a VAD segment maps straight onto the buffer.
What a turn or a commit takes out leaves the buffer; the caller makes it a conversation item.
"""

from __future__ import annotations

import numpy as np

from engine import INPUT_SAMPLE_RATE_HZ
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.input_buffer import InputAudioBuffer
from voice_gateway.realtime.turns import TurnChange, TurnTaking


class AudioInput:
    """Owns the uncommitted input audio (`buffer`) and turn detection (`turns`); the only writer of both."""

    def __init__(self, buffer: InputAudioBuffer, turns: TurnTaking) -> None:
        self.buffer = buffer
        self.turns = turns

    @property
    def duration_ms(self) -> int:
        return self.buffer.duration_ms

    @property
    def span_ms(self) -> tuple[int, int]:
        """Where the uncommitted audio starts and ends on the session's input clock."""
        return self.buffer.start_sample * 1000 // INPUT_SAMPLE_RATE_HZ, self.buffer.end_ms

    def decode(self, data: bytes, fmt: ev.AudioFormat) -> np.ndarray:
        """One append's client audio as 16 kHz float32 on the input stream; ValueError if malformed."""
        return self.buffer.decode(data, fmt)

    def configure(self, td: ev.TurnDetection | None) -> None:
        """A new turn detection (or none) counts from now; a segment in progress is forgotten."""
        self.turns.configure(td, self.buffer.end_ms)

    async def append(self, samples_16k: np.ndarray) -> list[TurnChange]:
        """Into the buffer (BufferFull when full) and the VAD: the speech starts and stops they complete, in order."""
        self.buffer.append(samples_16k)
        return await self.turns.feed(samples_16k)

    def take_turn(self, stopped: ev.SpeechStopped, prefix_padding_ms: int) -> np.ndarray:
        """The speech that just stopped, with `prefix_padding_ms` before its start; all before its end leaves."""
        return self.buffer.take_until(stopped.audio_end_ms, self.turns.start_ms - prefix_padding_ms)

    def turn_so_far(self, end_ms: int, prefix_padding_ms: int) -> np.ndarray:
        """What `take_turn` would take were the speech in progress to stop at `end_ms`; nothing leaves."""
        return self.buffer.peek(self.turns.start_ms - prefix_padding_ms, end_ms)

    def take_all(self) -> tuple[np.ndarray, str]:
        """Everything buffered, and the id of the item it becomes (the speech in progress's, else a new one)."""
        return self.buffer.take_all(), self.turns.take_item_id()

    def clear(self) -> None:
        self.buffer.clear()
        self.turns.forget_segment()
