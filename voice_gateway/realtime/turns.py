"""Turn taking: speech segments on the session's input clock, and the user item each one becomes.

`server_vad` ends a turn after a fixed silence (webrtcvad); `semantic_vad` when Smart Turn judges the utterance
complete (`audio/semantic_vad.py`), with the words said so far where the engine hears ahead (`hearing.py`), on the
server VAD with its eagerness's silence where the model is absent.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence

import numpy as np

from voice_gateway.audio.semantic_vad import ProbableEnd, Resumed, SemanticConfig, SemanticVad
from voice_gateway.audio.semantic_vad import TurnChange as VadChange
from voice_gateway.audio.smart_turn import load_smart_turn
from voice_gateway.audio.vad import ServerVad, VadConfig
from voice_gateway.audio.vad import SpeechStarted as VadStarted
from voice_gateway.realtime import events as ev
from voice_gateway.realtime.conversation import new_item_id
from voice_gateway.realtime.hearing import HearingAhead

TurnChange = ev.SpeechStarted | ev.SpeechStopped | ProbableEnd | Resumed


class TurnTaking:
    """Owns the VAD (None: the client takes turns with commit and response.create) and the segment in progress.
    `hearing`: how a semantic VAD hears the words of a pause (None: it judges the audio alone)."""

    def __init__(self, td: ev.TurnDetection | None = None, hearing: HearingAhead | None = None) -> None:
        self.hearing = hearing
        self.vad = None if td is None else _vad_for(td, hearing, 0)
        self._offset_ms = 0  # where the VAD's own clock starts on the session's input clock
        self.item_id: str | None = None  # the user item the speech in progress will become
        self.start_ms = 0  # where the latest segment began, on the session clock

    def configure(self, td: ev.TurnDetection | None, now_ms: int) -> None:
        """A fresh VAD (or none) from `now_ms` on; a segment in progress is forgotten."""
        self.vad = None if td is None else _vad_for(td, self.hearing, now_ms)
        self._offset_ms = now_ms
        self.item_id = None

    async def feed(self, samples_16k: np.ndarray) -> list[TurnChange]:
        """The speech starts and stops that these samples complete, as the events that announce them, and a semantic
        VAD's probable ends and resumptions (on the session's clock: no event of the protocol)."""
        vad = self.vad
        if vad is None:
            return []
        vad_changes: Sequence[VadChange]
        if isinstance(vad, SemanticVad) and vad.in_speech:
            # a pause may need the model's judgement: it runs on a thread, and this session's audio waits for it
            vad_changes = await asyncio.to_thread(vad.feed, samples_16k)
            if vad is not self.vad:
                return []  # reconfigured meanwhile (WebRTC's events and audio interleave): the new VAD starts afresh
        else:
            vad_changes = vad.feed(samples_16k)
        changes: list[TurnChange] = []
        for change in vad_changes:
            if isinstance(change, ProbableEnd):
                changes.append(ProbableEnd(change.audio_end_ms + self._offset_ms))
            elif isinstance(change, Resumed):
                changes.append(Resumed(change.audio_start_ms + self._offset_ms))
            elif isinstance(change, VadStarted):
                self.item_id, self.start_ms = new_item_id(), change.audio_start_ms + self._offset_ms
                changes.append(ev.SpeechStarted(audio_start_ms=self.start_ms, item_id=self.item_id))
            else:
                changes.append(ev.SpeechStopped(audio_end_ms=change.audio_end_ms + self._offset_ms,
                                                item_id=self.take_item_id()))
        return changes

    def take_item_id(self) -> str:
        """The id for the audio committed now: the speech in progress's, else a new one. The segment ends here."""
        item_id, self.item_id = self.item_id or new_item_id(), None
        return item_id

    def forget_segment(self) -> None:
        self.item_id = None


def _vad_for(td: ev.TurnDetection, hearing: HearingAhead | None, offset_ms: int) -> ServerVad | SemanticVad:
    if td.type == "semantic_vad":
        model = load_smart_turn()
        if model is not None:
            hear = None if hearing is None else functools.partial(hearing.from_thread, offset_ms,
                                                                  td.prefix_padding_ms)
            return SemanticVad(SemanticConfig(td.eagerness, td.threshold), model, hear=hear)
    # server_vad, or semantic_vad's fallback (load_smart_turn said why, once)
    return ServerVad(VadConfig(td.threshold, td.prefix_padding_ms, td.end_of_turn_silence_ms()))
