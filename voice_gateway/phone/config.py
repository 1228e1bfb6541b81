"""Phone calls' settings: the carrier accounts, the URL the carrier reaches this server at, and the calls' limits.
Set once at start (the command line and `VOICE_GATEWAY_TWILIO_*` variables); nothing below reads the environment."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PhoneConfig:
    # Twilio signs each webhook with the account's auth token; without one, the answer route refuses every call.
    twilio_auth_token: str | None = None
    twilio_account_sid: str | None = None  # hang-up and transfer go through the account's REST API
    twilio_api_base: str | None = None  # None: Twilio's own (https://api.twilio.com); a test's local server
    # The URL the carrier reaches this server at (https://voice.example.com): what a webhook's signature covers
    # behind a proxy that rewrites the host or the scheme, and where the media stream's wss:// URL points.
    # None: the request's own URL.
    public_url: str | None = None
    # Telnyx and Plivo: their answer URL carries ?secret=... with this value (their webhooks are not signed with a
    # shared key); None refuses their calls.
    carrier_secret: str | None = None
    # The app's server: told of each incoming call (a signed webhook), it accepts or rejects it. None: every
    # signed call is accepted with the profile's session.
    app_webhook_url: str | None = None
    app_webhook_secret: str | None = None  # standard-webhooks signing key ("whsec_" + base64)
    app_decision_s: float = 5.0  # the app's accept or reject must come within this (the carrier waits for it)
    call_tools: tuple[str, ...] = ()  # built-in tools every call's session has: end_call, transfer_call
    dtmf_items: bool = False  # a pressed key also becomes a user item the model sees
    token_ttl_s: float = 60.0  # an answered call's stream must start within this
    start_timeout_s: float = 10.0  # a stream that says no `start` by then is closed
    max_frame_bytes: int = 64 * 1024  # a 20 ms media frame is ~250 bytes of JSON
    lead_ms: int = 100  # how far ahead of the caller's ear audio is sent: enough for jitter, too little to burst
    max_sideband_messages: int = 4096  # events queued for a sideband that does not read; past this it is closed

    def __post_init__(self) -> None:
        if self.lead_ms < 20 or self.token_ttl_s <= 0 or self.start_timeout_s <= 0 or self.max_frame_bytes < 1024:
            raise ValueError(f"impossible phone settings: {self}")
        if bad := set(self.call_tools) - {"end_call", "transfer_call"}:
            raise ValueError(f"unknown call tools {sorted(bad)}: the built-ins are end_call and transfer_call")
