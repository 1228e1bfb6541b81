"""The tool-call parser on Qwen3's `<tool_call>` text, split at every position: the pieces it gives
back always join to the same content and calls."""

from __future__ import annotations

import json

import pytest

from voice_gateway.openai.tool_parser import Arguments, CallStart, Content, Piece, ToolCallParser

CALL_A = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris }", "days": [1, {"x": 2}]}}\n</tool_call>'
CALL_B = '<tool_call>\n{"name": "set_lamp", "arguments": {"on": true}}\n</tool_call>'
CASES = {
    "one call": ("", CALL_A, [("get_weather", {"city": 'Pa"ris }', "days": [1, {"x": 2}]})]),
    "text then two calls": ("Let me check. ", "Let me check. " + CALL_A + "\n" + CALL_B,
                            [("get_weather", {"city": 'Pa"ris }', "days": [1, {"x": 2}]}), ("set_lamp", {"on": True})]),
    "no call": ("a < b, and <tool_ is not a tag", "a < b, and <tool_ is not a tag", []),
    "keys the other way round": ("", '<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>', [("f", {"a": 1})]),
    "not a call inside the tags": ("<tool_call>hello</tool_call> ok", "<tool_call>hello</tool_call> ok", []),
}


def _run(parser: ToolCallParser, pieces: list[str]) -> list[Piece]:
    out: list[Piece] = []
    for piece in pieces:
        out += parser.feed(piece)
    return out + parser.close()


def _check(out: list[Piece], content: str, calls: list[tuple[str, dict]], parser: ToolCallParser) -> None:
    assert "".join(p.text for p in out if isinstance(p, Content)) == content
    starts = [p for p in out if isinstance(p, CallStart)]
    assert [(s.index, s.name) for s in starts] == [(i, name) for i, (name, _) in enumerate(calls)]
    for i, (name, arguments) in enumerate(calls):
        streamed = "".join(p.text for p in out if isinstance(p, Arguments) and p.index == i)
        assert json.loads(streamed) == arguments
        assert parser.calls[i].name == name and parser.calls[i].arguments == streamed
        assert parser.calls[i].id == starts[i].id
        # a call's start comes before its arguments
        assert out.index(starts[i]) < min(k for k, p in enumerate(out) if isinstance(p, Arguments) and p.index == i)
    assert len(parser.calls) == len(calls)


@pytest.mark.parametrize("case", list(CASES))
def test_every_split_gives_the_same_result(case: str) -> None:
    content, text, calls = CASES[case]
    for cut in range(len(text) + 1):
        parser = ToolCallParser()
        _check(_run(parser, [text[:cut], text[cut:]]), content, calls, parser)
    for cut in range(1, len(text)):  # and two cuts: one character at a time around each position
        parser = ToolCallParser()
        _check(_run(parser, [text[:cut - 1], text[cut - 1 : cut], text[cut:]]), content, calls, parser)


def test_one_character_at_a_time() -> None:
    content, text, calls = CASES["text then two calls"]
    parser = ToolCallParser()
    out = _run(parser, list(text))
    _check(out, content, calls, parser)
    assert sum(isinstance(p, Arguments) for p in out) > 10  # streamed, not given at the end


def test_max_calls_drops_the_rest() -> None:
    parser = ToolCallParser(max_calls=1)
    out = _run(parser, [CALL_A + "\n" + CALL_B])
    assert [p.name for p in out if isinstance(p, CallStart)] == ["get_weather"]
    assert {p.index for p in out if isinstance(p, Arguments)} == {0}
    assert [c.name for c in parser.calls] == ["get_weather"]


def test_a_call_cut_off_keeps_what_was_streamed() -> None:
    parser = ToolCallParser()
    out = _run(parser, ['<tool_call>\n{"name": "f", "arguments": {"a": "unfini'])
    assert [p.name for p in out if isinstance(p, CallStart)] == ["f"]
    assert parser.calls[0].arguments == '{"a": "unfini'
    parser = ToolCallParser()
    assert _run(parser, ["Hm. <tool_call>\n{\"na"]) == [Content("Hm. ")] and not parser.calls
