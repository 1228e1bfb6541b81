"""The phone's wire without a server: Twilio's signature check against Twilio's published example, and the three
carriers' media-stream messages (their references' examples) read and written through the one dialect table."""

from __future__ import annotations

import base64
import json
import xml.etree.ElementTree as ET

import pytest
from twilio.request_validator import RequestValidator

from voice_gateway.phone.answer import connect_document
from voice_gateway.phone.dialects import DIALECTS, CarrierError, Dtmf, MarkEcho, Media, Start, Stop, parse

# Twilio's security page: auth token 12345, this URL and these POST parameters sign as this
TWILIO_EXAMPLE_URL = "https://mycompany.com/myapp.php?foo=1&bar=2"
TWILIO_EXAMPLE_PARAMS = {"CallSid": "CA1234567890ABCDE", "Caller": "+14158675309", "Digits": "1234",
                         "From": "+14158675309", "To": "+18005551212"}
TWILIO_EXAMPLE_SIGNATURE = "RSOYDt4T1cUTdK1PDd93/VVr8B8="


def test_twilios_published_signature_example_validates() -> None:
    validator = RequestValidator("12345")
    assert validator.validate(TWILIO_EXAMPLE_URL, TWILIO_EXAMPLE_PARAMS, TWILIO_EXAMPLE_SIGNATURE)
    assert not validator.validate(TWILIO_EXAMPLE_URL, {**TWILIO_EXAMPLE_PARAMS, "Digits": "1235"},
                                  TWILIO_EXAMPLE_SIGNATURE)
    assert not RequestValidator("54321").validate(TWILIO_EXAMPLE_URL, TWILIO_EXAMPLE_PARAMS, TWILIO_EXAMPLE_SIGNATURE)


PAYLOAD = base64.b64encode(b"\xff" * 160).decode()
STARTS = {
    "twilio": {"event": "start", "sequenceNumber": "1", "streamSid": "MZ1", "start": {
        "accountSid": "AC1", "streamSid": "MZ1", "callSid": "CA1", "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        "customParameters": {"token": "t"}}},
    "telnyx": {"event": "start", "sequence_number": "1", "stream_id": "S1", "start": {
        "user_id": "u", "call_control_id": "CA1", "client_state": "x", "custom_parameters": {"token": "t"},
        "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1}}},
    "plivo": {"event": "start", "sequenceNumber": 1, "start": {
        "callId": "CA1", "streamId": "S1", "accountId": "A", "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000}}, "extra_headers": "token=t"},
}


@pytest.mark.parametrize("carrier", sorted(STARTS))
def test_each_carriers_start_names_the_call_and_its_token(carrier: str) -> None:
    start = parse(DIALECTS[carrier], json.dumps(STARTS[carrier]))
    assert isinstance(start, Start) and start.call_id == "CA1" and start.parameters == {"token": "t"}, start


@pytest.mark.parametrize("carrier", sorted(STARTS))
def test_media_dtmf_marks_and_stop_read_alike(carrier: str) -> None:
    dialect = DIALECTS[carrier]
    media = parse(dialect, json.dumps({"event": "media", "media": {"track": "inbound", "chunk": "2",
                                                                    "timestamp": "20", "payload": PAYLOAD}}))
    assert media == Media(b"\xff" * 160)
    assert parse(dialect, json.dumps({"event": "dtmf", "dtmf": {"track": "inbound_track", "digit": "#"}})) == Dtmf("#")
    echo = {"event": "playedStream", "name": "m1"} if carrier == "plivo" else {"event": "mark", "mark": {"name": "m1"}}
    assert parse(dialect, json.dumps(echo)) == MarkEcho("m1")
    assert parse(dialect, json.dumps({"event": "stop", "stop": {}})) == Stop()
    assert parse(dialect, json.dumps({"event": "error", "payload": {}})) is None  # known to no one: ignored


@pytest.mark.parametrize("carrier", sorted(STARTS))
def test_what_the_server_sends_is_each_carriers_spelling(carrier: str) -> None:
    dialect = DIALECTS[carrier]
    media, mark, clear = (json.loads(m) for m in (dialect.media("S1", b"\xff"), dialect.mark("S1", "m1"),
                                                  dialect.clear("S1")))
    key = {"twilio": "streamSid", "telnyx": "stream_id", "plivo": "streamId"}[carrier]
    assert media[key] == mark[key] == clear[key] == "S1"
    assert base64.b64decode(media["media"]["payload"]) == b"\xff"
    if carrier == "plivo":
        assert (media["event"], mark, clear["event"]) == ("playAudio", {"event": "checkpoint", "name": "m1",
                                                                        "streamId": "S1"}, "clearAudio")
        assert media["media"]["contentType"] == "audio/x-mulaw" and media["media"]["sampleRate"] == 8000
    else:
        assert (media["event"], mark["mark"], clear["event"]) == ("media", {"name": "m1"}, "clear")


@pytest.mark.parametrize("frame", ["not json", "[]", '{"event": "media"}', '{"event": "media", "media": '
                                   '{"payload": "***"}}', '{"event": "dtmf", "dtmf": {"digit": "12"}}',
                                   json.dumps({**STARTS["twilio"], "start": {**STARTS["twilio"]["start"],
                                               "mediaFormat": {"encoding": "audio/l16", "sampleRate": 16000}}})])
def test_a_malformed_frame_is_a_carrier_error(frame: str) -> None:
    with pytest.raises(CarrierError):
        parse(DIALECTS["twilio"], frame)


def test_the_answer_connects_the_stream_with_the_token_escaped() -> None:
    doc = connect_document("twilio", "wss://voice.example.com/v1/phone/twilio/media", 'a"b<c')
    stream = ET.fromstring(doc).find("./Connect/Stream")
    assert stream is not None and stream.attrib["url"] == "wss://voice.example.com/v1/phone/twilio/media", doc
    assert [(p.attrib["name"], p.attrib["value"]) for p in stream] == [("token", 'a"b<c')], doc
    assert "extraHeaders=" in connect_document("plivo", "wss://h/v1/phone/plivo/media", "t")
