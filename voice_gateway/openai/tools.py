"""A chat request's tools, tool choice and response format -> the engine's tools and output constraint.

Every refusal is a 400 that names the field at fault (`tools.1.function.parameters`). `tool_choice: "auto"` (the
default with tools) puts the tools in the prompt and parses calls out of the text (tool_parser.py); `"none"`
leaves them out; `"required"` or a named function decodes the reply under a grammar of tool calls, so each
call's arguments validate (one call when `parallel_tool_calls` is false). `response_format` `json_schema` /
`json_object` decodes under that schema (or any JSON object); a required or named tool choice takes precedence."""

from __future__ import annotations

from engine import JsonOutput, OutputConstraint, Tool, ToolCallOutput, schema_error
from voice_gateway.errors import APIError
from voice_gateway.openai.schemas import ChatCompletionRequest, NamedToolChoice


def tools_of(body: ChatCompletionRequest) -> tuple[Tool, ...]:
    if not body.tools or body.tool_choice == "none":
        return ()
    return tuple(Tool(t.function.name, t.function.description, t.function.parameters) for t in body.tools)


def check_tools(body: ChatCompletionRequest) -> None:
    seen: set[str] = set()
    for i, tool in enumerate(body.tools or ()):
        name = tool.function.name
        if name in seen:
            raise APIError(400, f"tools.{i}.function.name: {name!r} is the name of an earlier tool too",
                           param=f"tools.{i}.function.name", code="invalid_value")
        seen.add(name)
        if tool.function.parameters is not None and (error := schema_error(tool.function.parameters)):
            raise APIError(400, f"Invalid schema for function {name!r}: {error}",
                           param=f"tools.{i}.function.parameters", code="invalid_function_parameters")
    if body.tool_choice is not None and not body.tools:
        raise APIError(400, "tool_choice is only allowed when tools are given", param="tool_choice",
                       code="invalid_value")
    if isinstance(body.tool_choice, NamedToolChoice) and body.tool_choice.function.name not in seen:
        raise APIError(400, f"tool_choice names {body.tool_choice.function.name!r}, which is not among the tools",
                       param="tool_choice.function.name", code="invalid_value")
    if body.parallel_tool_calls is not None and not body.tools:
        raise APIError(400, "parallel_tool_calls is only allowed when tools are given",
                       param="parallel_tool_calls", code="invalid_value")


def output_constraint(body: ChatCompletionRequest) -> OutputConstraint | None:
    """What the reply is held to, if anything; checks the tools and the format first."""
    check_tools(body)
    parallel = body.parallel_tool_calls is not False
    if body.tools and body.tool_choice == "required":
        return ToolCallOutput(None, parallel)
    if body.tools and isinstance(body.tool_choice, NamedToolChoice):
        return ToolCallOutput(body.tool_choice.function.name, parallel)
    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        if fmt is not None and fmt.json_schema is not None:
            raise APIError(400, "response_format.json_schema goes with type \"json_schema\"",
                           param="response_format.type", code="invalid_value")
        return None
    if fmt.type == "json_object":
        return JsonOutput(None)
    if fmt.json_schema is None:
        raise APIError(400, "response_format.json_schema is required with type \"json_schema\"",
                       param="response_format.json_schema", code="invalid_value")
    schema = fmt.json_schema.schema_
    if schema is not None and (error := schema_error(schema)):
        raise APIError(400, f"Invalid schema for response_format {fmt.json_schema.name!r}: {error}",
                       param="response_format.json_schema.schema", code="invalid_json_schema")
    return JsonOutput(schema)


def max_calls(body: ChatCompletionRequest) -> int | None:
    """How many calls of a reply the client gets (None: all)."""
    return 1 if body.parallel_tool_calls is False else None
