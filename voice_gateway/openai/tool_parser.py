"""Tool calls out of a reply's text stream: Qwen3's `<tool_call>{"name": ..., "arguments": ...}</tool_call>`.

`ToolCallParser` takes the text in any pieces (a tag or a JSON key may be split anywhere) and gives back typed
pieces in order: content, a call's start (index, id, name), then its arguments as the model writes them, as
OpenAI streams `tool_calls` deltas. A `<tool_call>` whose text is not a call is content; the whitespace between
calls is not."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

START, END = "<tool_call>", "</tool_call>"
# a call's text up to its arguments' value, when the model writes the keys in the template's order
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


@dataclass(frozen=True, slots=True)
class Content:
    text: str


@dataclass(frozen=True, slots=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class Arguments:
    index: int
    text: str


Piece = Content | CallStart | Arguments


@dataclass(frozen=True, slots=True)
class ParsedCall:
    id: str
    name: str
    arguments: str


def _held_back(text: str, tag: str) -> int:
    """How many characters at the end of `text` might begin `tag` (and must wait for the next piece)."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


@dataclass(slots=True)
class _ValueEnd:
    """Finds where one JSON value ends, a character at a time (strings and nesting respected)."""

    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    started: bool = False
    ended: bool = False

    def take(self, text: str) -> int:
        """How many characters of `text` belong to the value (all of them, until it ends)."""
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    if self.depth == 0:
                        self.ended = True
                        return i + 1
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                if self.depth == 0:  # the object around the value closes: a bare value ended before it
                    self.ended = True
                    return i
                self.depth -= 1
                if self.depth == 0:
                    self.ended = True
                    return i + 1
            elif ch == '"':
                self.in_string = True
            elif self.started and self.depth == 0 and (ch == "," or ch.isspace()):
                self.ended = True
                return i
            self.started = True
        return len(text)


@dataclass(slots=True)
class _Call:
    index: int
    body: str = ""
    id: str = ""
    name: str | None = None  # once its start went out
    args_from: int = 0  # where the arguments begin in `body`
    sent: int = 0  # of `body`, the characters given out as arguments (from args_from)
    value: _ValueEnd = field(default_factory=_ValueEnd)


class ToolCallParser:
    """One reply's text -> content and tool-call pieces. `max_calls`: calls past it are dropped."""

    def __init__(self, max_calls: int | None = None) -> None:
        self.max_calls = max_calls
        self.calls: list[ParsedCall] = []
        self._pending = ""  # text not yet given out
        self._call: _Call | None = None
        self._opened = 0  # calls begun, wanted or not
        self._gap = ""  # whitespace after a call: content only if more text follows

    def feed(self, text: str) -> list[Piece]:
        self._pending += text
        out: list[Piece] = []
        while True:
            if self._call is None:
                at = self._pending.find(START)
                if at < 0:
                    keep = _held_back(self._pending, START)
                    self._emit_content(out, self._pending[: len(self._pending) - keep])
                    self._pending = self._pending[len(self._pending) - keep :]
                    return out
                self._emit_content(out, self._pending[:at])
                self._gap = ""
                self._pending = self._pending[at + len(START) :]
                self._call = _Call(index=self._opened)
                self._opened += 1
            call = self._call
            at = self._pending.find(END)
            if at < 0:
                keep = _held_back(self._pending, END)
                call.body += self._pending[: len(self._pending) - keep]
                self._pending = self._pending[len(self._pending) - keep :]
                self._stream(call, out)
                return out
            call.body += self._pending[:at]
            self._pending = self._pending[at + len(END) :]
            self._stream(call, out)
            self._finish(call, out)

    def close(self) -> list[Piece]:
        """The reply's end: what was held back, and a call cut off as it stands (dropped if its name is unwritten)."""
        out: list[Piece] = []
        if self._call is not None:
            self._call.body += self._pending
            self._stream(self._call, out)
            self._finish(self._call, out, cut=True)
        else:
            self._emit_content(out, self._pending)
        self._pending = ""
        return out

    def _emit_content(self, out: list[Piece], text: str) -> None:
        if self._opened and not text.strip():
            self._gap += text
        elif text:
            out.append(Content(self._gap + text))
            self._gap = ""

    def _wanted(self, call: _Call) -> bool:
        return self.max_calls is None or call.index < self.max_calls

    def _stream(self, call: _Call, out: list[Piece]) -> None:
        if call.name is None:
            head = _HEAD.match(call.body)
            if head is None:
                return
            try:
                name = json.loads(f'"{head.group(1)}"')
            except json.JSONDecodeError:
                return
            call.name, call.id, call.args_from = name, f"call_{uuid.uuid4().hex[:24]}", head.end()
            if self._wanted(call):
                out.append(CallStart(call.index, call.id, name))
        if call.value.ended:
            return
        fresh = call.body[call.args_from + call.sent :]
        n = call.value.take(fresh)
        if n and self._wanted(call):
            out.append(Arguments(call.index, fresh[:n]))
        call.sent += n

    def _finish(self, call: _Call, out: list[Piece], cut: bool = False) -> None:
        self._call = None
        if call.name is not None:
            arguments = call.body[call.args_from : call.args_from + call.sent]
        else:
            parsed = _whole_call(call.body)
            if parsed is None:  # not a call after all: the model's text, as it wrote it (unless cut off)
                if not cut:
                    self._emit_content(out, START + call.body + END)
                return
            call.name, call.id = parsed[0], f"call_{uuid.uuid4().hex[:24]}"
            arguments = parsed[1]
            if self._wanted(call):
                out += [CallStart(call.index, call.id, call.name), Arguments(call.index, arguments)]
        if self._wanted(call):
            self.calls.append(ParsedCall(call.id, call.name, arguments))


def _whole_call(body: str) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of a call written some other way than the template's order."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or "arguments" not in call:
        return None
    arguments = call["arguments"]
    return call["name"], arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
