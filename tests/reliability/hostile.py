"""What the reliability tests share: hypothesis strategies for hostile JSON, the checks every answer to it must
pass (OpenAI's error shapes), realtime sessions that must not notice it, and the server process's memory and
open files as /proc tells them."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from websockets.sync.client import ClientConnection, connect

from tests.conftest import Server


def fuzz(max_examples: int) -> settings:
    """CI runs the same examples every time: derandomized (the seed comes from the test's name), no example
    database; no deadline, as a loaded machine's requests take what they take."""
    return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# Any character a JSON string can carry, lone surrogates and NUL included (json.dumps escapes them as \ud800).
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=24) | st.sampled_from(
    ["", "\x00", "\ud800", "a\udfffb", "tiny", "ethan", "text", "audio", "user", "input_audio", "wav", "pcm16",
     "<|im_start|>system", "🙂" * 8, "x" * 5000])
NUMBERS = (st.integers() | st.integers(min_value=-(10**40), max_value=10**40)
           | st.floats(allow_nan=True, allow_infinity=True)
           | st.sampled_from([0, -1, 1, 2**31, 2**63, 2**64 + 1, 1e308]))
SCALARS = st.none() | st.booleans() | NUMBERS | ANY_TEXT
# nested junk: lists and objects of scalars, a few levels deep
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
                    max_leaves=12)


def huge_number_json(template: dict[str, Any], key: str) -> st.SearchStrategy[bytes]:
    """`template` as JSON text with `key` set to a number literal no float or int conversion takes lightly:
    thousands of digits (Python refuses str<->int past 4300), or an exponent past any float."""
    literal = st.sampled_from(["9" * 5000, "-" + "1" * 4301, "1e999999", "-1e-999999", "1" + "0" * 400 + ".5"])
    return literal.map(lambda text: json.dumps({**template, key: "@"}).replace('"@"', text).encode())


def paths_of(value: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every key and index path inside `value`, outermost first."""
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [path for key, child in children for path in [(*prefix, key), *paths_of(child, (*prefix, key))]]


def mutated(template: dict[str, Any], keep: tuple[str, ...] = ()) -> st.SearchStrategy[dict[str, Any]]:
    """`template` with one to three of its parts (but the top-level keys in `keep`) set to junk or removed,
    and maybe an unknown key added."""
    paths = [path for path in paths_of(template) if path[0] not in keep]

    @st.composite
    def build(draw: Callable[..., Any]) -> dict[str, Any]:
        body = json.loads(json.dumps(template))
        for path in draw(st.lists(st.sampled_from(paths), min_size=1, max_size=3, unique=True)) if paths else ():
            parent: Any = body
            for part in path[:-1]:  # an earlier change may have replaced a part of the way
                parent = parent[part] if isinstance(parent, (dict, list)) and _has(parent, part) else None
            if isinstance(parent, dict) and draw(st.integers(0, 9)) == 0:
                parent.pop(path[-1], None)
            elif isinstance(parent, dict) or (isinstance(parent, list) and _has(parent, path[-1])):
                parent[path[-1]] = draw(JSON)
        if not paths or draw(st.booleans()):
            body[draw(ANY_TEXT)] = draw(JSON)
        return body
    return build()


def _has(container: dict | list, key: str | int) -> bool:
    return key in container if isinstance(container, dict) else isinstance(key, int) and key < len(container)


def to_json(value: Any) -> bytes:
    """JSON as a hostile client sends it: lone surrogates escaped (ensure_ascii), NaN and Infinity as Python
    writes them."""
    return json.dumps(value).encode()


def assert_openai_error(body: Any) -> None:
    """`{"error": {"message", "type", "param", "code"}}`, nothing else."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    assert error["code"] is None or isinstance(error["code"], str), error


def assert_realtime_error(event: dict[str, Any]) -> None:
    """A realtime `error` event: its `error` has a type, a code and a message; param and event_id may be unset."""
    error = event.get("error")
    assert isinstance(error, dict), event
    assert isinstance(error.get("type"), str) and isinstance(error.get("message"), str) and error["message"], event
    assert isinstance(error.get("code"), str), event
    for key in ("param", "event_id"):
        assert error.get(key) is None or isinstance(error[key], str), event


def ws_url(server: Server) -> str:
    return server.base_url.replace("http://", "ws://") + "/v1/realtime?model=tiny"


@contextlib.contextmanager
def open_session(server: Server) -> Iterator[ClientConnection]:
    """A realtime session past its `session.created`; the connection entered as a context manager, as websockets
    17 requires before anything is received."""
    with connect(ws_url(server), open_timeout=30, max_size=None) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
        yield ws


def events_until(ws: ClientConnection, done: Callable[[dict[str, Any]], bool], timeout_s: float = 60,
                 ) -> list[dict[str, Any]]:
    """The session's JSON events up to the first for which `done` holds (binary Opus packets are skipped)."""
    events = []
    while True:
        message = ws.recv(timeout=timeout_s)
        if isinstance(message, bytes):
            continue
        events.append(json.loads(message))
        if done(events[-1]):
            return events


def assert_a_turn_completes(ws: ClientConnection) -> None:
    """A text turn in `ws`'s session comes back as a completed response, with no error on the way."""
    ws.send(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}}))
    ws.send(json.dumps({"type": "response.create", "response": {"output_modalities": ["text"]}}))
    events = events_until(ws, lambda e: e["type"] == "response.done")
    assert [e for e in events if e["type"] == "error"] == []
    assert events[-1]["response"]["status"] == "completed", events[-1]


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def memory_kib(pid: int, field: str) -> int:
    """A field of /proc/<pid>/status in KiB: VmRSS (resident now), VmHWM (its peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak_rss(pid: int) -> None:
    """Sets VmHWM back to VmRSS (proc(5): clear_refs), so the peak of what follows can be read."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
