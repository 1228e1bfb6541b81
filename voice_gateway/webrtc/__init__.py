"""Realtime sessions over WebRTC: the POST /v1/realtime/calls route, its calls' settings, and the aiortc call behind it."""

from voice_gateway.webrtc.config import WebRTCConfig
from voice_gateway.webrtc.route import router

__all__ = ["WebRTCConfig", "router"]
