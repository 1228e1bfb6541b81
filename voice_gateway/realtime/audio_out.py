"""A session's way out for reply audio: the sink each response writes into, and stopping what plays out.

A WebRTC call plays every reply on its media track, whatever the output format; a WebSocket session keeps
one event sink per output format for the session's life (Opus's packet counters run on across responses).
"""

from __future__ import annotations

from voice_gateway.realtime import events as ev
from voice_gateway.realtime.audio_sinks import AudioSink, TrackSink, event_sink
from voice_gateway.realtime.sender import EventSender


class AudioOut:
    """Owns the session's sinks: its `track` (None over WebSocket) and the event sinks made so far."""

    def __init__(self, sender: EventSender, opus_bitrate_bps: int, track: TrackSink | None) -> None:
        self.sender = sender
        self.opus_bitrate_bps = opus_bitrate_bps
        self.track = track
        self._sinks: dict[ev.AudioFormat, AudioSink] = {}

    def sink_for(self, fmt: ev.AudioFormat) -> AudioSink:
        if self.track is not None:
            return self.track
        if fmt not in self._sinks:
            self._sinks[fmt] = event_sink(fmt, self.sender, self.opus_bitrate_bps)
        return self._sinks[fmt]

    @property
    def playing(self) -> str | None:
        """The response whose audio the track plays out now (generation may have finished)."""
        return self.track.playing if self.track is not None else None

    def clear_playback(self, response_id: str) -> None:
        assert self.track is not None, "only a track plays audio out"
        self.track.cancel()
        self.sender.event(ev.OutputAudioBufferCleared(response_id=response_id))
