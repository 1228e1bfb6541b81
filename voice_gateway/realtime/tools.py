"""A realtime session's tools and tool choice: their checks, and what they make of a response's engine request.

They mean what they mean in chat completions (voice_gateway/openai/tools.py): with `"auto"` (the default) the
model may call the tools in its prompt and calls are parsed out of its text; `"none"` leaves them out of the
prompt; `"required"` or a named function decodes the reply under a grammar of one tool call, so its arguments
validate. One call: realtime has no `parallel_tool_calls`, and a grammar that allows more lets a model that does
not stop (the random tiny one) call on until its length limit cuts a call short, which a client would then run.
With no `max_output_tokens`, the engine gives the call the rest of the context. A refusal names its field in
the session's path style (`session.tools.1.parameters`)."""

from __future__ import annotations

from engine import OutputConstraint, Tool, ToolCallOutput, schema_error
from voice_gateway.realtime.events import NamedToolChoice, ProtocolError, SessionConfig
from voice_gateway.realtime.events.session import FunctionTool, ToolChoice


def tool_errors(tools: tuple[FunctionTool, ...], where: str, event_id: str | None) -> list[ProtocolError]:
    """What is wrong with `tools` (each error names the tool's field), or nothing."""
    errors: list[ProtocolError] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.name in seen:
            errors.append(ProtocolError("invalid_value", f"{where}.tools.{i}.name: {tool.name!r} is the name of an "
                                        "earlier tool too", event_id, f"{where}.tools.{i}.name"))
        seen.add(tool.name)
        if tool.parameters is not None and (error := schema_error(tool.parameters)):
            errors.append(ProtocolError("invalid_function_parameters",
                                        f"Invalid schema for function {tool.name!r}: {error}", event_id,
                                        f"{where}.tools.{i}.parameters"))
    return errors


def choice_error(choice: ToolChoice, tools: tuple[FunctionTool, ...], where: str,
                 event_id: str | None) -> ProtocolError | None:
    """A named function that is not among the tools. A call `required` of no tools is refused only when
    a response would run under it (`response_tool_error`): a session may require one before it has
    tools, as Pipecat sends its settings' `tool_choice` in one session.update and its tools in a later one."""
    if isinstance(choice, NamedToolChoice) and choice.name not in {t.name for t in tools}:
        return ProtocolError("invalid_value", f"tool_choice names {choice.name!r}, which is not among the tools",
                             event_id, f"{where}.tool_choice.name")
    return None


def settle_tools(current: SessionConfig, updated: SessionConfig, event_id: str | None) -> tuple[SessionConfig,
                                                                                                 list[ProtocolError]]:
    """`updated`, with bad tools or an unmeetable tool choice put back as in `current`, and the errors saying why."""
    errors = tool_errors(updated.tools, "session", event_id)
    if errors:
        updated = updated.model_copy(update={"tools": current.tools})
    if (error := choice_error(updated.tool_choice, updated.tools, "session", event_id)) is not None:
        errors.append(error)
        updated = updated.model_copy(update={"tool_choice": current.tool_choice})
        if choice_error(updated.tool_choice, updated.tools, "session", event_id) is not None:
            updated = updated.model_copy(update={"tools": current.tools})  # they dropped what the choice names
    return updated, errors


def response_tool_error(config: SessionConfig, event_id: str | None) -> ProtocolError | None:
    """Why one response cannot run with the tools `response.create` gave it, if it cannot."""
    errors = tool_errors(config.tools, "response", event_id)
    if errors:
        return errors[0]
    if config.tool_choice == "required" and not config.tools:
        return ProtocolError("invalid_value", "tool_choice \"required\" needs at least one tool", event_id,
                             "response.tool_choice")
    return choice_error(config.tool_choice, config.tools, "response", event_id)


def engine_tools(config: SessionConfig) -> tuple[Tool, ...]:
    if config.tool_choice == "none":
        return ()
    return tuple(Tool(t.name, t.description, t.parameters) for t in config.tools)


def output_constraint(config: SessionConfig) -> OutputConstraint | None:
    if not config.tools:
        return None
    if config.tool_choice == "required":
        return ToolCallOutput(None, parallel=False)
    if isinstance(config.tool_choice, NamedToolChoice):
        return ToolCallOutput(config.tool_choice.name, parallel=False)
    return None
