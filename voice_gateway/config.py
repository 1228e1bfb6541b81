"""Gateway limits and access settings, set once from the command line."""

from __future__ import annotations

from dataclasses import dataclass, field

from voice_gateway.media.images import ImageLimits
from voice_gateway.media.videos import VideoLimits


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    api_key: str | None = None
    max_sessions: int = 64
    max_session_s: float = 30 * 60
    max_append_bytes: int = 15 * 1024 * 1024  # OpenAI's limit for one input_audio_buffer.append
    max_input_buffer_s: float = 10 * 60  # more than a session stores (max_stored_audio_s) is never heard
    send_queue_messages: int = 2048  # ~40 s of 20 ms Opus packets
    # Opus is a perceptual codec: speech keeps ~24 dB SNR at 64 kb/s, but the tiny model's noise
    # needs ~128 kb/s for 20 dB. One mono voice at 96 kb/s is 12 KB/s.
    opus_bitrate_bps: int = 96_000
    max_body_bytes: int = 32 * 1024 * 1024  # one HTTP request body, read before it is parsed
    max_input_audio_s: float = 600.0  # one uploaded chat audio part; the engine's own limit is 600 s
    # Who may open a realtime session besides a client without an Origin, the page's own origin, and a Host
    # that is loopback: browser origins (scheme://host[:port]) and Host names; "*" takes any.
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    public_metrics: bool = False  # /metrics without the API key (a scraper inside the deployment)
    # A realtime session's memory. Its conversation keeps the audio of the items its prompt can use, and
    # at most this much in all (16 kHz float32: 64 KB/s); 600 s is about what an 8192-token context holds
    # at 13 tokens per second of audio. Older audio goes; its items stay, with their text.
    max_stored_audio_s: float = 600.0
    # Slow clients (voice_gateway/read_deadline.py): a connection is closed that takes longer than this to send
    # a request's head, from its start or its last response, or that pauses longer than this inside a body.
    header_timeout_s: float = 15.0
    body_timeout_s: float = 30.0
    images: ImageLimits = field(default_factory=ImageLimits)  # input images, in chat and realtime
    videos: VideoLimits = field(default_factory=VideoLimits)  # input videos (chat's video_url parts)

    def __post_init__(self) -> None:
        if self.max_sessions < 1 or self.max_session_s <= 0 or self.send_queue_messages < 16 \
                or self.max_body_bytes < 1024 or self.max_input_audio_s <= 0:
            raise ValueError(f"impossible gateway limits: {self}")
        if self.max_stored_audio_s <= 0:
            raise ValueError(f"max_stored_audio_s must be > 0, got {self.max_stored_audio_s}")
        if bad := [o for o in self.allowed_origins if o != "*" and "://" not in o]:
            raise ValueError(f"allowed origins are scheme://host[:port], got {bad}")
        if self.header_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError(f"read timeouts must be > 0 s, got {self.header_timeout_s} and {self.body_timeout_s}")
