"""What the assistant's voice says of a reply (engine/cascade/speak.py): its text, never its tool calls."""

from __future__ import annotations

from engine.cascade.speak import speakable

REPLY = 'Sure, the lamp. <tool_call>\n{"name": "set_lamp", "arguments": {"on": true}}\n</tool_call>\nIt is on.'


def test_a_tool_call_is_never_spoken_however_the_text_arrives() -> None:
    said = [speakable(REPLY[:n]) for n in range(len(REPLY) + 1)]
    assert said[-1] == "Sure, the lamp. It is on."
    assert all(later.startswith(earlier) for earlier, later in zip(said, said[1:], strict=False))  # only grows
    assert not any("tool_call" in s or "set_lamp" in s for s in said)


def test_an_angle_bracket_that_opens_no_call_is_spoken() -> None:
    assert speakable("a < b") == "a < b" and speakable("ok <") == "ok "
