"""The incoming-call webhook to the app's server (voice_gateway/phone/app_webhook.py) against a real local HTTP
server that answers as told: an app that is briefly down or busy gets the call on a later attempt, under the same
webhook id and a signature that verifies each time; an app that refuses is not asked again."""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from voice_gateway.phone.app_webhook import incoming_call_event, notify_app

pytestmark = pytest.mark.asyncio
SECRET = "whsec_" + base64.b64encode(b"the app's signing key").decode()


class App(ThreadingHTTPServer):
    """Answers each POST with the next of `statuses` (the last one from then on), keeping the headers it got."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses, self.seen = statuses, []
        app = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["content-length"]))
                app.seen.append((dict(self.headers), body))
                self.send_response(app.statuses[min(len(app.seen), len(app.statuses)) - 1])
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/webhook"


@pytest.fixture
def app_of(request: pytest.FixtureRequest) -> Iterator:
    made: list[App] = []

    def make(statuses: list[int]) -> App:
        made.append(App(statuses))
        return made[-1]

    yield make
    for app in made:
        app.shutdown()
        app.server_close()


def _verifies(headers: dict[str, str], body: bytes) -> bool:
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return hmac.compare_digest(expected, headers["webhook-signature"])


async def test_an_app_briefly_down_or_busy_gets_the_call_on_a_later_attempt(app_of) -> None:
    app = app_of([503, 429, 200])
    body = incoming_call_event("CA1", "+15550001", "+15550002", "twilio")
    assert await notify_app(app.url, SECRET, body, timeout_s=5)
    assert len(app.seen) == 3
    assert len({headers["webhook-id"] for headers, _ in app.seen}) == 1  # one event, tried three times
    assert all(_verifies(headers, sent) and sent == body for headers, sent in app.seen)


async def test_an_app_that_refuses_is_not_asked_again(app_of) -> None:
    app = app_of([400])
    assert not await notify_app(app.url, SECRET, incoming_call_event("CA1", "", "", "twilio"), timeout_s=5)
    assert len(app.seen) == 1


async def test_an_app_down_for_good_is_given_up_on_at_the_deadline(app_of) -> None:
    app = app_of([503])
    assert not await notify_app(app.url, None, incoming_call_event("CA1", "", "", "twilio"), timeout_s=1)
    assert 2 <= len(app.seen) <= 4  # 0.2 s, 0.4 s, 0.8 s apart
    gone = "http://127.0.0.1:9/webhook"  # nothing listens: transport errors, tried again until the deadline
    assert not await notify_app(gone, None, incoming_call_event("CA1", "", "", "twilio"), timeout_s=0.5)
