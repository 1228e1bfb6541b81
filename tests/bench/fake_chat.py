"""A loopback stand-in for a chat server that the bench's media tests run against: it keeps every request body and
streams one text reply whose usage counts 24 image tokens a picture (`image_url`) and 96 a clip (`video_url`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

PICTURE_TOKENS = 24
CLIP_TOKENS = 96


class FakeChat(BaseHTTPRequestHandler):
    requests: list[dict[str, Any]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        raw = json.dumps({"object": "list", "data": [{"id": "fake", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        content = body["messages"][0]["content"]
        kinds = [] if isinstance(content, str) else [p["type"] for p in content]
        image_tokens = PICTURE_TOKENS * kinds.count("image_url") + CLIP_TOKENS * kinds.count("video_url")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        usage = {"prompt_tokens": 10 + image_tokens, "completion_tokens": 1,
                 "prompt_tokens_details": {"audio_tokens": 0, "image_tokens": image_tokens}}
        for chunk in ({"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]},
                      {"choices": [], "usage": usage}):
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture
def fake_chat() -> Iterator[tuple[str, type[FakeChat]]]:
    """The fake's base URL and its handler class (its `requests`, this test's alone)."""
    handler = type("Handler", (FakeChat,), {"requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
