"""How a conversation leaves the prompt once it outgrows the context (voice_gateway/realtime/conversation.py):
a block of the oldest items at once, down to the share the session's `truncation` retains, so that the
prompt starts the same for many turns after; never the instructions or tools; an error when disabled."""

from __future__ import annotations

import pytest

from voice_gateway.realtime import events as ev
from voice_gateway.realtime.conversation import AUTO_RETENTION, ContextFull, Conversation, Item

ROOM = 1_000  # the conversation's budget, in estimated tokens
TOOL = ev.FunctionTool(name="set_lamp", description="Turns the lamp on or off. " * 20,
                       parameters={"type": "object", "properties": {"on": {"type": "boolean"}}})


def config(truncation: ev.Truncation = "auto", **settings: object) -> ev.SessionConfig:
    return ev.SessionConfig(truncation=truncation, **settings)  # type: ignore[arg-type]


def ratio(r: float, post_instructions: int | None = None) -> ev.RetentionRatio:
    limits = None if post_instructions is None else ev.TokenLimits(post_instructions=post_instructions)
    return ev.RetentionRatio(type="retention_ratio", retention_ratio=r, token_limits=limits)


def turn(conversation: Conversation, n: int) -> None:
    """A user's question and the assistant's answer, ~50 estimated tokens each (letters: a digit is a token)."""
    conversation.add(Item(f"u{n}", "user", f"question {chr(97 + n)}xy " * 12))
    conversation.add(Item(f"a{n}", "assistant", f"answer {chr(97 + n)}xyz " * 12))


def used(conversation: Conversation) -> int:
    return sum(item.estimated_tokens() for item in conversation.items if item.in_context)


def first_kept(conversation: Conversation) -> str:
    return next(item.id for item in conversation.items if item.in_context)


def test_nothing_leaves_while_the_history_fits() -> None:
    conversation = Conversation(ROOM, 16_000, 16)
    for n in range(8):
        turn(conversation, n)
    assert used(conversation) <= ROOM
    conversation.prompt(config())
    assert all(item.in_context for item in conversation.items)


@pytest.mark.parametrize("retention", [0.0, 0.3, 0.5, 0.8, 1.0])
def test_a_cut_keeps_the_retained_share(retention: float) -> None:
    """The oldest items leave until the rest fits `retention` of the room, and no more leave than that takes."""
    conversation = Conversation(ROOM, 16_000, 16)
    for n in range(11):
        turn(conversation, n)
    assert used(conversation) > ROOM
    conversation.prompt(config(ratio(retention)))
    live = [item for item in conversation.items if item.in_context]
    gone = [item for item in conversation.items if not item.in_context]
    assert used(conversation) <= max(retention * ROOM, live[-1].estimated_tokens())
    assert used(conversation) + gone[-1].estimated_tokens() > retention * ROOM  # the last to go had to
    assert conversation.items[: len(gone)] == gone  # the oldest, in order
    assert live[-1] is conversation.items[-1]  # the newest always stays


def test_auto_cuts_a_block_and_the_prompt_then_starts_the_same_for_many_turns() -> None:
    conversation = Conversation(4 * ROOM, 16_000, 16)
    instructions = config(instructions="Be brief.")
    starts = []
    for n in range(90):
        turn(conversation, n)
        prompt = conversation.prompt(instructions)
        assert prompt[0].role == "system"
        starts.append(prompt[1])
        assert used(conversation) <= conversation.room(instructions)
    cuts = [n for n in range(1, 90) if starts[n] != starts[n - 1]]
    # each cut leaves half the room (~2,000 tokens) to fill: ~16 turns of ~120 tokens pass before the next
    assert AUTO_RETENTION == 0.5 and len(cuts) >= 3
    assert all(b - a >= 14 for a, b in zip(cuts, cuts[1:], strict=False)), cuts


def test_trimming_one_item_per_turn_is_what_retention_one_does() -> None:
    """A ratio of 1 keeps as much as fits: the prompt's start moves on every turn once the room is full."""
    conversation = Conversation(ROOM, 16_000, 16)
    starts = []
    for n in range(20):
        turn(conversation, n)
        conversation.prompt(config(ratio(1.0)))
        starts.append(first_kept(conversation))
    trimmed = [n for n, start in enumerate(starts) if start != "u0"]
    assert len(trimmed) > 5
    assert all(starts[n] != starts[n - 1] for n in trimmed[1:])


def test_instructions_and_tools_stay_and_take_their_room_first() -> None:
    conversation = Conversation(ROOM, 16_000, 16)
    for n in range(9):
        turn(conversation, n)
    plain, equipped = config(), config(instructions="You are a lamp. " * 40, tools=(TOOL,))
    assert conversation.room(equipped) < conversation.room(plain) - 200
    prompt = conversation.prompt(equipped)
    assert prompt[0].role == "system" and prompt[0].content[0].text == equipped.instructions  # type: ignore[union-attr]
    assert used(conversation) <= AUTO_RETENTION * conversation.room(equipped)


def test_post_instructions_limits_the_room() -> None:
    conversation = Conversation(ROOM, 16_000, 16)
    limited = config(ratio(0.5, post_instructions=400))
    assert conversation.room(limited) == 400
    for n in range(5):
        turn(conversation, n)
    conversation.prompt(limited)
    assert used(conversation) <= 200


def test_disabled_fails_and_drops_nothing() -> None:
    conversation = Conversation(ROOM, 16_000, 16)
    for n in range(11):
        turn(conversation, n)
    with pytest.raises(ContextFull) as raised:
        conversation.prompt(config("disabled"))
    assert raised.value.code == "context_length_exceeded"
    assert "truncation is disabled" in str(raised.value)
    assert all(item.in_context for item in conversation.items)


def test_a_tool_output_leaves_with_its_call() -> None:
    conversation = Conversation(ROOM, 16_000, 16)
    conversation.add(Item("u", "user", "lamp on please " * 30))
    conversation.add(Item("c", "assistant", kind="function_call", call_id="x", name="set_lamp", arguments="{}"))
    conversation.add(Item("o", "tool", "done " * 40, kind="function_call_output", call_id="x"))
    for n in range(9):
        turn(conversation, n)
    conversation.prompt(config(ratio(0.9)))
    assert not conversation.get("c").in_context  # type: ignore[union-attr]
    assert not conversation.get("o").in_context  # type: ignore[union-attr]
    assert conversation.prompt(config(ratio(0.9)))[0].role != "tool"


def test_a_late_tool_output_leaves_with_its_call() -> None:
    """An async tool's result arrives turns after its call: when the call leaves, the result goes with it."""
    conversation = Conversation(ROOM, 16_000, 16)
    conversation.add(Item("c", "assistant", kind="function_call", call_id="x", name="set_lamp", arguments="{}"))
    for n in range(4):
        turn(conversation, n)
    conversation.add(Item("o", "tool", "done", kind="function_call_output", call_id="x"))
    for n in range(4, 11):
        turn(conversation, n)
    prompt = conversation.prompt(config(ratio(0.9)))
    assert not conversation.get("c").in_context  # type: ignore[union-attr]
    assert not conversation.get("o").in_context  # type: ignore[union-attr]
    assert all(message.role != "tool" for message in prompt)


def test_digits_and_other_scripts_count_a_token_each() -> None:
    """Qwen's tokenizer makes each digit a token: a history of readings must not pass for a third of its size."""
    assert Item("r", "user", "4711 " * 50).estimated_tokens() >= 200
    assert Item("z", "user", "你好" * 50).estimated_tokens() >= 100
    assert Item("e", "user", "hello there " * 25).estimated_tokens() < 120


def test_the_newest_item_stays_even_alone_too_big() -> None:
    conversation = Conversation(ROOM, 16_000, 16)
    turn(conversation, 0)
    conversation.add(Item("big", "user", "x" * 4 * ROOM))
    prompt = conversation.prompt(config())
    assert [item.id for item in conversation.items if item.in_context] == ["big"]
    assert len(prompt) == 1  # the engine's own count refuses it, with its own error


def test_an_item_that_left_does_not_come_back() -> None:
    conversation = Conversation(ROOM, 16_000, 16)
    for n in range(11):
        turn(conversation, n)
    conversation.prompt(config(ratio(0.5)))
    gone = [item.id for item in conversation.items if not item.in_context]
    for item_id in [item.id for item in conversation.items if item.in_context][:-1]:
        conversation.delete(item_id)  # room again, but what left stays out
    conversation.prompt(config())
    assert [item.id for item in conversation.items if not item.in_context] == gone


def _cuts(cut_early: float) -> list[int]:
    """The turns at which a conversation of `cut_early` leaves items out, in 120 turns."""
    conversation = Conversation(4 * ROOM, 16_000, 16, cut_early=cut_early)
    cuts, gone = [], 0
    for n in range(120):
        turn(conversation, n)
        conversation.prompt(config())
        if (now := sum(not item.in_context for item in conversation.items)) > gone:
            assert used(conversation) <= AUTO_RETENTION * 4 * ROOM  # a cut keeps the retained share, however early
            cuts.append(n)
        gone = now
    return cuts


def test_conversations_that_began_together_cut_at_their_own_turns() -> None:
    # each cut re-prefills most of a prompt: calls that all cut at one turn would bring those re-prefills at once
    calls = [_cuts(cut_early) for cut_early in (0.0, 0.125, 0.25, 0.375, 0.5)]
    firsts = [cuts[0] for cuts in calls]
    assert firsts == sorted(firsts, reverse=True) and len(set(firsts)) >= 4, firsts
    # at most halfway from the full room (4,000) down to the retained share (2,000): ~8 turns of ~120 tokens early
    assert firsts[0] - firsts[-1] <= 10, firsts
    # only the first cut is early: the later ones are a whole room apart, so a call cuts no more often, and the
    # calls stay apart
    assert all(len(cuts) <= len(calls[0]) + 1 for cuts in calls), calls
    assert all(len({cuts[k] for cuts in calls}) >= 3 for k in range(5)), calls
