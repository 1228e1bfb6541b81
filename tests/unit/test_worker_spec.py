"""`serve --http-workers N` tells each worker a typed `WorkerSpec` through one environment variable: it comes
back equal, for an engine process's socket and for replicas on Ray, and a bad one is refused on the way in. It carries the phone's settings, secrets included (the workers' environment is
the server's own)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from engine.deploy import RayAddress
from voice_gateway.app import WORKER_ENV, WorkerSpec
from voice_gateway.config import GatewayConfig
from voice_gateway.media.images import ImageLimits
from voice_gateway.phone import PhoneConfig
from voice_gateway.webrtc.config import WebRTCConfig


@pytest.mark.parametrize("engine_at", [("/tmp/vg-engine/engine.sock", os.urandom(16)),
                                       RayAddress("10.0.0.1:6379", "voice-gateway-1-ab", 2)])
def test_a_published_spec_reads_back_equal(monkeypatch: pytest.MonkeyPatch, engine_at) -> None:
    monkeypatch.delenv(WORKER_ENV, raising=False)
    gateway = GatewayConfig(allowed_origins=("https://a.example",), images=ImageLimits(fetch_hosts=("img.example",)))
    phone = PhoneConfig(twilio_auth_token="t", call_tools=("end_call",), dtmf_items=True)
    spec = WorkerSpec(engine_at, "INFO", Path("/tmp/metrics"), gateway, WebRTCConfig(host_addresses=("10.0.0.2",)),
                      phone, Path("/tmp/calls"))
    spec.publish()
    assert WorkerSpec.read() == spec


def test_a_spec_with_impossible_settings_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WORKER_ENV, raising=False)
    WorkerSpec(("/tmp/s", b"k"), "INFO", Path("/tmp/m"), GatewayConfig(), WebRTCConfig(), PhoneConfig(),
               Path("/tmp/c")).publish()
    published = os.environ[WORKER_ENV]
    monkeypatch.setenv(WORKER_ENV, published.replace('"max_sessions":64', '"max_sessions":0'))
    with pytest.raises(ValidationError, match="impossible gateway limits"):
        WorkerSpec.read()
    monkeypatch.setenv(WORKER_ENV, published.replace('"lead_ms":100', '"lead_ms":5'))
    with pytest.raises(ValidationError, match="impossible phone settings"):
        WorkerSpec.read()
