"""Gateway metrics (sessions, turn latency, chat first-chunk latency, cancellations); the engine keeps its own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_TURN_BUCKETS_S = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.active_sessions = Gauge("gateway_active_sessions", "Open realtime sessions", ["transport"], registry=r)
        self.turn_latency = Histogram(
            "gateway_speech_stop_to_first_audio_seconds",
            "From the end of the user's speech (VAD) to the reply's first audio sent",
            buckets=_TURN_BUCKETS_S,
            registry=r,
        )
        self.cancelled_responses = Counter(
            "gateway_cancelled_responses", "Responses cancelled before they finished", ["reason"], registry=r
        )
        self.protocol_errors = Counter("gateway_protocol_errors", "Error events sent to clients", ["code"], registry=r)
        self.refused_sessions = Counter("gateway_refused_sessions", "Sessions refused at connect", ["reason"], registry=r)
        # against engine_ttft/ttfp_seconds (from submit to the engine's event): what the HTTP side adds
        self.chat_ttft = Histogram(
            "gateway_chat_ttft_seconds", "Chat completion: request handed to the app to its first text chunk written",
            buckets=_TURN_BUCKETS_S, registry=r,
        )
        self.chat_ttfp = Histogram(
            "gateway_chat_ttfp_seconds", "Chat completion: request handed to the app to its first audio chunk written",
            buckets=_TURN_BUCKETS_S, registry=r,
        )
