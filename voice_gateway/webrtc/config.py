"""WebRTC calls' settings: importable without the `[webrtc]` extra, so a server without aiortc still starts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WebRTCConfig:
    # aioice offers host candidates on every interface but loopback; a deployment (or a test in
    # its own network namespace) that must stay on given addresses names them here.
    host_addresses: tuple[str, ...] = ()
    connect_timeout_s: float = 20.0  # ICE + DTLS must be up by then
    idle_timeout_s: float = 120.0  # no microphone audio for this long closes the call
