"""The carriers' media-stream dialects: what Twilio, Telnyx and Plivo call the same messages, in one table, and the
typed messages a stream's JSON text becomes (`parse`) or is made from (`media`, `mark`, `clear`).

All three carry G.711 µ-law at 8 kHz, base64 in JSON text frames; the carrier opens the socket, says `start` with
the call's id and the parameters its answer document set, sends the caller's audio as `media`, a pressed key as
`dtmf`, echoes each `mark` the server sent once the audio before it has played (or `clear` dropped it), and says
`stop`. They differ only in names, which the `Dialect` rows hold."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class CarrierError(Exception):
    """A frame that is not the carrier's protocol; its text says what was wrong."""


@dataclass(frozen=True, slots=True)
class Dialect:
    """One carrier's names for the same messages (`_TWILIO`, `_TELNYX`, `_PLIVO` are the rows)."""

    name: str
    stream_key: str  # the stream's id, at the top level of every message that names it
    call_key: str  # the call's id, inside `start`
    params_key: str  # the answer document's parameters, inside `start` (Plivo: at the top level)
    format_key: str  # the media format, inside `start`
    rate_key: str  # its sample rate
    mulaw: frozenset[str]  # how the format names µ-law
    media_out: Callable[[str], dict[str, Any]]  # base64 µ-law -> the media message (less the stream id)
    mark_out: Callable[[str], dict[str, Any]]  # a name -> the message that asks for its echo
    mark_in: str  # the event that echoes a mark
    mark_name: Callable[[dict[str, Any]], Any]  # where an echoed mark's name is
    clear_out: str  # the event that drops queued audio

    def media(self, stream_id: str, ulaw: bytes) -> str:
        return json.dumps({**self.media_out(base64.b64encode(ulaw).decode()), self.stream_key: stream_id})

    def mark(self, stream_id: str, name: str) -> str:
        return json.dumps({**self.mark_out(name), self.stream_key: stream_id})

    def clear(self, stream_id: str) -> str:
        return json.dumps({"event": self.clear_out, self.stream_key: stream_id})


def _media(payload: str) -> dict[str, Any]:
    return {"event": "media", "media": {"payload": payload}}


def _mark(name: str) -> dict[str, Any]:
    return {"event": "mark", "mark": {"name": name}}


def _mark_name(message: dict[str, Any]) -> Any:
    mark = message.get("mark")
    return mark.get("name") if isinstance(mark, dict) else None


_TWILIO = Dialect("twilio", "streamSid", "callSid", "customParameters", "mediaFormat", "sampleRate",
                  frozenset({"audio/x-mulaw"}), _media, _mark, "mark", _mark_name, "clear")
_TELNYX = Dialect("telnyx", "stream_id", "call_control_id", "custom_parameters", "media_format", "sample_rate",
                  frozenset({"PCMU", "audio/x-mulaw"}), _media, _mark, "mark", _mark_name, "clear")
# Plivo plays `playAudio`, asks for a `checkpoint`, echoes it as `playedStream`, and drops audio on `clearAudio`
_PLIVO = Dialect("plivo", "streamId", "callId", "extra_headers", "mediaFormat", "sampleRate",
                 frozenset({"audio/x-mulaw"}),
                 lambda payload: {"event": "playAudio", "media": {"contentType": "audio/x-mulaw", "sampleRate": 8000,
                                                                  "payload": payload}},
                 lambda name: {"event": "checkpoint", "name": name}, "playedStream", lambda m: m.get("name"),
                 "clearAudio")
DIALECTS = {d.name: d for d in (_TWILIO, _TELNYX, _PLIVO)}


@dataclass(frozen=True, slots=True)
class Connected:
    pass


@dataclass(frozen=True, slots=True)
class Start:
    stream_id: str
    call_id: str
    parameters: dict[str, str]


@dataclass(frozen=True, slots=True)
class Media:
    ulaw: bytes  # 8 kHz µ-law, one byte per sample


@dataclass(frozen=True, slots=True)
class Dtmf:
    digit: str


@dataclass(frozen=True, slots=True)
class MarkEcho:
    name: str


@dataclass(frozen=True, slots=True)
class Stop:
    pass


CarrierMessage = Connected | Start | Media | Dtmf | MarkEcho | Stop


def parse(dialect: Dialect, text: str | bytes) -> CarrierMessage | None:
    """One frame as its message; None for a message the server has no use for (Telnyx's `error`, a new kind).
    CarrierError when the frame is not JSON, or a known message lacks what it must carry."""
    try:
        message = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise CarrierError(f"not JSON: {e}") from None
    if not isinstance(message, dict) or not isinstance(event := message.get("event"), str):
        raise CarrierError("a message is a JSON object with an 'event'")
    if event == "connected":
        return Connected()
    if event == "start":
        return _start(dialect, message)
    if event == "media":
        payload = _field(message, "media", "payload")
        try:
            return Media(base64.b64decode(payload, validate=True))
        except (binascii.Error, ValueError):
            raise CarrierError("media.payload is not base64") from None
    if event == "dtmf":
        digit = _field(message, "dtmf", "digit")
        if len(digit) != 1 or digit not in "0123456789*#ABCD":
            raise CarrierError(f"dtmf.digit {digit[:8]!r} is not a key")
        return Dtmf(digit)
    if event == dialect.mark_in:
        name = dialect.mark_name(message)
        if not isinstance(name, str):
            raise CarrierError(f"{event} without a name")
        return MarkEcho(name)
    if event == "stop":
        return Stop()
    return None


def _start(dialect: Dialect, message: dict[str, Any]) -> Start:
    start = message.get("start")
    if not isinstance(start, dict):
        raise CarrierError("start without its 'start' object")
    stream_id = message.get(dialect.stream_key) or start.get(dialect.stream_key)
    call_id = start.get(dialect.call_key)
    if not isinstance(stream_id, str) or not isinstance(call_id, str):
        raise CarrierError(f"start names no {dialect.stream_key} and {dialect.call_key}")
    fmt = start.get(dialect.format_key) or {}
    if not isinstance(fmt, dict) or fmt.get("encoding") not in dialect.mulaw or int(fmt.get(dialect.rate_key, 0)) != 8000:
        raise CarrierError(f"the stream's format is {fmt!r}: only µ-law at 8000 Hz is spoken here")
    raw = start.get(dialect.params_key, message.get(dialect.params_key)) or {}
    return Start(stream_id, call_id, _parameters(raw))


def _parameters(raw: Any) -> dict[str, str]:
    # Plivo's extra headers come as "k1=v1,k2=v2"; Twilio's and Telnyx's parameters as an object
    if isinstance(raw, str):
        raw = dict(pair.split("=", 1) for pair in raw.split(",") if "=" in pair)
    if not isinstance(raw, dict):
        raise CarrierError("the stream's parameters are not an object")
    return {str(k): str(v) for k, v in raw.items()}


def _field(message: dict[str, Any], outer: str, inner: str) -> str:
    value = message.get(outer)
    value = value.get(inner) if isinstance(value, dict) else None
    if not isinstance(value, str):
        raise CarrierError(f"{message.get('event')} without {outer}.{inner}")
    return value
