"""What the demo page puts on the wire, as the driver's scenarios watch it through playwright: the events it sends on
its WebSockets, one ordered log of both directions in brief, and the SDP offer it POSTs to /v1/realtime/calls."""

from __future__ import annotations

import json


def watch_sent(page, sent: list[dict]) -> None:
    """Every JSON event but the mic's appends that the page sends on its WebSockets, in order."""
    def on_frame(payload: str | bytes) -> None:
        event = json.loads(payload) if isinstance(payload, str) else {}
        if event and event.get("type") != "input_audio_buffer.append":
            sent.append(event)

    page.on("websocket", lambda ws: ws.on("framesent", on_frame))


def brief(event: dict) -> dict:
    """An event's type and what the camera tests read of it: an item's role and part types (never an image's
    bytes), a commit's item, a response's prompt image tokens, an image URL's scheme and media type."""
    out: dict = {"type": event.get("type")}
    if item := event.get("item"):
        out["item"] = {"id": item.get("id"), "role": item.get("role"),
                       "content": [part.get("type") for part in item.get("content") or []]}
        urls = [part["image_url"] for part in item.get("content") or [] if part.get("image_url")]
        if urls:
            out["image_urls"] = [url.split(",", 1)[0] for url in urls]  # "data:image/jpeg;base64"
    if "item_id" in event:
        out["item_id"] = event["item_id"]
    if event.get("type") == "response.done":
        usage = (event.get("response") or {}).get("usage") or {}
        out["image_tokens"] = (usage.get("input_token_details") or {}).get("image_tokens", 0)
    return out


def watch_wire(page, log: list[dict]) -> None:
    """One log, in the order the browser saw them, of the JSON events the page sent ("sent") and received
    ("received") on its WebSockets, audio appends and deltas left out; and the WebRTC offer ("offer")."""
    def on_frame(direction: str, payload: str | bytes) -> None:
        if not isinstance(payload, str):
            return
        event = json.loads(payload)
        if event.get("type") not in ("input_audio_buffer.append", "response.output_audio.delta"):
            log.append({"dir": direction, **brief(event)})

    def on_websocket(ws) -> None:
        ws.on("framesent", lambda payload: on_frame("sent", payload))
        ws.on("framereceived", lambda payload: on_frame("received", payload))

    def on_request(request) -> None:
        if request.method == "POST" and request.url.split("?")[0].endswith("/v1/realtime/calls"):
            log.append({"dir": "offer", "sdp": request.post_data or ""})

    page.on("websocket", on_websocket)
    page.on("request", on_request)


def media_sections(sdp: str) -> dict[str, str]:
    """An SDP's m-sections by kind ("audio", "video", "application"): the first of each, with its direction."""
    sections: dict[str, str] = {}
    for chunk in sdp.split("m=")[1:]:
        kind = chunk.split(" ", 1)[0]
        direction = next((d for d in ("sendrecv", "sendonly", "recvonly", "inactive") if f"a={d}" in chunk), "")
        sections.setdefault(kind, direction)
    return sections
