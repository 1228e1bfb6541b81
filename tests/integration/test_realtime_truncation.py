"""The session's `truncation` through the official SDK's GA client on a real server: set and echoed, a bad
value refused by itself, and "disabled" failing a response whose conversation outgrew the context."""

from __future__ import annotations

import pytest

from tests.conftest import Server
from tests.integration.test_realtime import client_for, events_until

RETAIN_HALF = {"type": "retention_ratio", "retention_ratio": 0.5, "token_limits": {"post_instructions": 400}}


async def test_truncation_is_set_and_echoed(server: Server) -> None:
    async with client_for(server) as client, client.realtime.connect(model="tiny") as conn:
        created = await conn.recv()
        assert created.type == "session.created" and created.session.truncation == "auto"
        await conn.session.update(session={"type": "realtime", "truncation": RETAIN_HALF})
        updated = (await events_until(conn, "session.updated"))[-1]
        assert updated.session.truncation.retention_ratio == 0.5
        assert updated.session.truncation.token_limits.post_instructions == 400
        # a ratio past 1 is refused by itself: the instructions beside it apply, the truncation stays
        await conn.session.update(session={"type": "realtime", "instructions": "Be brief.",
                                           "truncation": {"type": "retention_ratio", "retention_ratio": 1.5}})
        events = await events_until(conn, "session.updated")
    [error] = [e for e in events if e.type == "error"]
    assert error.error.code == "invalid_value" and error.error.param.startswith("session.truncation")
    assert events[-1].session.instructions == "Be brief."
    assert events[-1].session.truncation.retention_ratio == 0.5


@pytest.mark.parametrize("truncation", ["disabled", "auto"])
async def test_a_conversation_past_the_context(server: Server, truncation: str) -> None:
    """The tiny model's context is 1,024 tokens: 12 long items outgrow it. Disabled: the response fails and
    every item stays; auto: the oldest leave the prompt and the reply completes."""
    async with client_for(server) as client, client.realtime.connect(model="tiny") as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"], "max_output_tokens": 4,
                                           "truncation": truncation, "audio": {"input": {"turn_detection": None}}})
        await events_until(conn, "session.updated")
        for i in range(12):
            text = f"note {i}: " + "the quick brown fox jumps over the lazy dog " * 6
            await conn.conversation.item.create(item={
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
            await events_until(conn, "conversation.item.done")
        await conn.response.create()
        done = (await events_until(conn, "response.done"))[-1].response
    if truncation == "disabled":
        assert done.status == "failed"
        assert done.status_details.error.code == "context_length_exceeded"
        assert done.status_details.error.type == "invalid_request_error"
        assert "truncation is disabled" in done.status_details.error.message
        assert "session" in server.log() and "response refused" in server.log()
    else:
        assert done.status == "completed", done.status_details
        assert 0 < done.usage.input_tokens < 1024 - 4
