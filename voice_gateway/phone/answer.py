"""The answer documents: what the carrier's answer webhook gets back, telling it to connect the call to this server's
media stream with the call's token as a parameter (Twilio's TwiML, Telnyx's TeXML, Plivo's XML), and the URLs in
them, built from the public URL a proxy may put in front of the server."""

from __future__ import annotations

from xml.sax.saxutils import quoteattr

from fastapi import Request

from voice_gateway.phone.config import PhoneConfig


def public_url(request: Request, cfg: PhoneConfig) -> str:
    """The URL the carrier requested, as it saw it: what a webhook's signature covers."""
    if cfg.public_url is None:
        return str(request.url)
    query = f"?{request.url.query}" if request.url.query else ""
    return cfg.public_url.rstrip("/") + request.url.path + query


def media_url(request: Request, cfg: PhoneConfig, carrier: str) -> str:
    base = (cfg.public_url or str(request.base_url)).rstrip("/")
    ws_base = "wss://" + base[len("https://"):] if base.startswith("https://") else "ws://" + base.split("://", 1)[-1]
    return f"{ws_base}/v1/phone/{carrier}/media"


def connect_document(carrier: str, stream_url: str, token: str) -> str:
    """The answer that connects the call to `stream_url`, bidirectionally, its token a stream parameter."""
    if carrier == "plivo":
        return ('<?xml version="1.0" encoding="UTF-8"?><Response><Stream bidirectional="true" keepCallAlive="true" '
                f'contentType="audio/x-mulaw;rate=8000" extraHeaders={quoteattr("token=" + token)}>{stream_url}'
                "</Stream></Response>")
    mode = ' bidirectionalMode="rtp"' if carrier == "telnyx" else ""
    return ('<?xml version="1.0" encoding="UTF-8"?><Response><Connect>'
            f'<Stream url={quoteattr(stream_url)}{mode}><Parameter name="token" value={quoteattr(token)}/></Stream>'
            "</Connect></Response>")


def reject_document(carrier: str) -> str:
    if carrier == "plivo":
        return '<?xml version="1.0" encoding="UTF-8"?><Response><Hangup reason="rejected"/></Response>'
    return '<?xml version="1.0" encoding="UTF-8"?><Response><Reject reason="rejected"/></Response>'
