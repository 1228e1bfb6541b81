"""`response.create` read and checked: the settings a response runs with, its prompt source, its metadata.

Anything the request asks that this session or engine cannot give becomes an `error` event, and no response.
"""

from __future__ import annotations

from dataclasses import dataclass

from voice_gateway.realtime import events as ev
from voice_gateway.realtime.checks import RequestChecks
from voice_gateway.realtime.client_items import ClientItemReader
from voice_gateway.realtime.conversation import Conversation
from voice_gateway.realtime.out_of_band import ResponseContext, response_context
from voice_gateway.realtime.tools import response_tool_error


@dataclass(frozen=True, slots=True)
class ResponseRequest:
    config: ev.SessionConfig  # the session's, with the request's overrides
    context: ResponseContext
    metadata: dict[str, str] | None  # echoed in response.created and response.done


async def read_response_create(event: ev.ResponseCreate, session_config: ev.SessionConfig, checks: RequestChecks,
                               reader: ClientItemReader, conversation: Conversation) -> ResponseRequest | None:
    """The response `event` asks for, or None where it cannot be had (the client told why)."""
    overrides = event.response
    instructions = overrides.instructions if overrides is not None else None
    if not checks.text_fits(instructions, "instructions", event.event_id, "response.instructions"):
        return None
    try:
        config = ev.apply_response_overrides(session_config, event)
    except ev.ProtocolError as e:
        checks.reporter.report(e)
        return None
    if config.voice != session_config.voice and not checks.voice_exists(config.voice, event.event_id, "response"):
        return None
    if (tool_error := response_tool_error(config, event.event_id)) is not None:
        checks.reporter.report(tool_error)
        return None
    if (context := await response_context(reader, conversation, overrides, event.event_id)) is None:
        return None
    return ResponseRequest(config, context, overrides.metadata if overrides is not None else None)
