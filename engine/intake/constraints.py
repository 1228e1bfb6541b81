"""What a reply must look like -> the grammar text the Thinker decodes under (constrained decoding).

A request's `OutputConstraint` becomes one llguidance grammar here, at the front door; the text travels with the
admitted request and the Thinker compiles it against its tokenizer (engine/omni/runners/sampler.py). llguidance builds each step's mask
lazily from an Earley parser, so a new schema compiles cheaply (every request may bring its own tools), and its
Lark grammars name special tokens (`<tool_call>`), which Qwen's tool-call format needs. Calls follow Qwen3's
template, `<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>`, newline-separated. JSON takes
`json.dumps`'s spacing and no other whitespace, and an object that lists `properties` and is silent on
`additionalProperties` gets those keys only (`closed`), as frameworks mean it: a wandering model (a random one)
would otherwise never finish, or add keys."""

from __future__ import annotations

import json
from typing import Any

import llguidance

from engine.api import JsonOutput, OutputConstraint, Tool, ToolCallOutput

# json.dumps' separators, and whitespace nowhere else
_JSON_STYLE = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
ANY_OBJECT: dict[str, Any] = {"type": "object"}


def schema_error(schema: dict[str, Any]) -> str | None:
    """Why the grammar engine cannot decode under `schema` (an invalid or unsupported schema), or None."""
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=_JSON_STYLE)  # type: ignore[arg-type]
    except ValueError as e:
        return str(e)
    return llguidance.LLMatcher.validate_grammar(grammar) or None


def grammar_for(constraint: OutputConstraint, tools: tuple[Tool, ...], *, tags_are_tokens: bool = True) -> str:
    """The grammar of a reply under `constraint`; `tools`: the request's, for a tool-call constraint;
    `tags_are_tokens`: the vocabulary has `<tool_call>` and `</tool_call>` as tokens (Qwen's), else they are text.
    Raises ValueError when it cannot be decoded (a schema the engine does not support, an unknown tool)."""
    if isinstance(constraint, JsonOutput):
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            constraint.schema if constraint.schema is not None else ANY_OBJECT, overrides=_JSON_STYLE  # type: ignore[arg-type]
        )
    else:
        grammar = llguidance.LLMatcher.grammar_from_lark(_tool_calls_lark(constraint, tools, tags_are_tokens))
    if error := llguidance.LLMatcher.validate_grammar(grammar):
        raise ValueError(error)
    return grammar


# the keywords whose value is one subschema, or a list or a name -> subschema map of them; allOf is left alone:
# closing each of its parts would forbid the others' properties
_SUBSCHEMA = ("items", "additionalProperties", "not", "if", "then", "else", "contains")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def closed(schema: Any) -> Any:
    """`schema` with each object that lists `properties`, silent on additional and pattern properties, held to them."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA:
        if key in out:
            out[key] = closed(out[key])
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed(s) for s in out[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(s) for name, s in out[key].items()}
    if isinstance(out.get("properties"), dict) and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def _tool_calls_lark(constraint: ToolCallOutput, tools: tuple[Tool, ...], tags_are_tokens: bool) -> str:
    chosen = [t for t in tools if constraint.name is None or t.name == constraint.name]
    if not chosen:
        raise ValueError(f"no tool named {constraint.name!r}" if constraint.name else "no tools to call")
    # each tool's arguments are a grammar of their own: its schema stays a root, so its `$ref`s resolve
    more = ' ("\\n" call)*' if constraint.parallel else ""
    start, end = ("<tool_call>", "</tool_call>") if tags_are_tokens else ('"<tool_call>"', '"</tool_call>"')
    rules = [f"start: call{more}",
             "call: " + " | ".join(f"call_{i}" for i in range(len(chosen)))]
    for i, tool in enumerate(chosen):
        head = json.dumps('\n{"name": ' + json.dumps(tool.name) + ', "arguments": ')
        schema = {**closed(tool.parameters if tool.parameters is not None else ANY_OBJECT), "x-guidance": _JSON_STYLE}
        rules.append(f'call_{i}: {start} {head} args_{i} "}}\\n" {end}')
        rules.append(f"args_{i}: %json {json.dumps(schema)}")
    return "\n".join(rules) + "\n"
