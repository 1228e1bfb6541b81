"""Constrained decoding: grammars from constraints, the batch's token masks, and the sampler under them.

A random "model" (a seeded pick among the allowed tokens) decodes under each grammar, as the random
tiny model does in the server: its JSON must still validate."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch
from transformers import AutoTokenizer

from engine.api import JsonOutput, Tool, ToolCallOutput
from engine.intake.constraints import closed, grammar_for, schema_error
from engine.omni.runners.sampler import Grammars, GrammarState, RowSampling, TokenMask, allow_only, sample

VOCAB = 152064  # the Thinker's logits are wider than the tokenizer's 151676 ids
EOS = 151645
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 6},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"enum": ["c", "f"]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = (
    Tool("get_weather", "the weather", CITY),
    Tool("set_lamp", None, {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"],
                            "additionalProperties": False}),
)


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint: Path):
    return AutoTokenizer.from_pretrained(tiny_checkpoint)


@pytest.fixture(scope="module")
def grammars(tokenizer) -> Grammars:
    return Grammars(tokenizer)


def _allowed_ids(bits: torch.Tensor) -> torch.Tensor:
    return ((bits[:, None] >> torch.arange(32, dtype=torch.int32)) & 1).flatten().nonzero().flatten()


def _decode(grammars: Grammars, grammar_texts: list[str | None], seeds: list[int],
            steps: int = 120) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
    """Decode rows together under their grammars (None: free): a seeded random pick among each
    row's allowed tokens (any token for a free row); each row's tokens and, per step, its mask bits."""
    states: list[GrammarState | None] = [None if g is None else grammars.start(g) for g in grammar_texts]
    gens = [torch.Generator().manual_seed(seed) for seed in seeds]
    out: list[list[int]] = [[] for _ in seeds]
    masks: list[list[torch.Tensor]] = [[] for _ in seeds]
    live = list(range(len(seeds)))
    for _ in range(steps):
        if not live:
            break
        allowed = grammars.mask([states[i] for i in live])
        bits = {} if allowed is None else {live[row]: allowed.bits[k] for k, row in enumerate(allowed.rows)}
        for i in list(live):
            if i in bits:
                masks[i].append(bits[i].clone())
                ids = _allowed_ids(bits[i])
                token = int(ids[torch.randint(len(ids), (), generator=gens[i])])
            else:
                token = int(torch.randint(VOCAB, (), generator=gens[i]))
            out[i].append(token)
            state = states[i]
            if state is not None:
                state.accept(token)
                if state.done:
                    live.remove(i)
    return out, masks


def _text(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode([t for t in ids if t != EOS], skip_special_tokens=True)


def test_json_schema_output_validates(grammars: Grammars, tokenizer) -> None:
    grammar = grammar_for(JsonOutput(CITY), ())
    out, _ = _decode(grammars, [grammar] * 4, seeds=[1, 2, 3, 4])
    for ids in out:
        assert EOS not in ids[:-1]  # the grammar ends the reply: at its last token, or with EOS
        jsonschema.validate(json.loads(_text(tokenizer, ids)), CITY)


def test_tool_calls_follow_qwen_format_and_validate(grammars: Grammars, tokenizer) -> None:
    for constraint in (ToolCallOutput(), ToolCallOutput("set_lamp", parallel=False)):
        out, _ = _decode(grammars, [grammar_for(constraint, TOOLS)] * 3, seeds=[5, 6, 7], steps=200)
        for ids in out:
            text = _text(tokenizer, ids)
            calls = text.split("\n")  # <tool_call>, body, </tool_call>, and a newline between calls
            assert len(calls) % 3 == 0 and (constraint.parallel or len(calls) == 3), text
            for k in range(0, len(calls), 3):
                assert calls[k] == "<tool_call>" and calls[k + 2] == "</tool_call>", text
                call = json.loads(calls[k + 1])
                assert list(call) == ["name", "arguments"]
                assert constraint.name in (None, call["name"])
                tool = next(t for t in TOOLS if t.name == call["name"])
                jsonschema.validate(call["arguments"], tool.parameters)


def test_a_tool_schema_silent_on_extra_keys_gets_its_own_only(grammars: Grammars, tokenizer) -> None:
    # the schema LiveKit writes for `set_lamp(on: bool)`: no additionalProperties, so a random model would add keys
    lamp = {"type": "object", "properties": {"on": {"type": "boolean", "title": "On"}}, "required": ["on"]}
    grammar = grammar_for(ToolCallOutput("set_lamp", parallel=False), (Tool("set_lamp", None, lamp),))
    out, _ = _decode(grammars, [grammar] * 4, seeds=[8, 9, 10, 11], steps=60)
    for ids in out:
        call = json.loads(_text(tokenizer, ids).split("\n")[1])
        assert list(call["arguments"]) == ["on"] and isinstance(call["arguments"]["on"], bool), call
    # what says otherwise, and a free-form object, stay as they are; nested objects close too
    assert closed({"type": "object", "properties": {}, "additionalProperties": True})["additionalProperties"] is True
    assert closed({"type": "object"}) == {"type": "object"}
    nested = closed({"type": "array", "items": {"type": "object", "properties": {"x": {"type": "integer"}}}})
    assert nested["items"]["additionalProperties"] is False


def test_the_batched_mask_equals_each_row_alone(grammars: Grammars) -> None:
    texts: list[str | None] = [grammar_for(JsonOutput(CITY), ()), None, grammar_for(ToolCallOutput(), TOOLS),
                               grammar_for(JsonOutput(), ()), None]
    seeds = [11, 12, 13, 14, 15]
    together, together_masks = _decode(grammars, texts, seeds, steps=30)
    for i, (text, seed) in enumerate(zip(texts, seeds, strict=True)):
        alone, alone_masks = _decode(grammars, [text], [seed], steps=30)
        assert together[i] == alone[0]
        assert len(together_masks[i]) == len(alone_masks[0]) == (0 if text is None else len(alone[0]))
        for a, b in zip(together_masks[i], alone_masks[0], strict=True):
            assert torch.equal(a, b)


def test_the_sampler_draws_allowed_tokens_whatever_the_batch(grammars: Grammars) -> None:
    texts = [grammar_for(JsonOutput(CITY), ()), None, grammar_for(ToolCallOutput(), TOOLS)]
    states = [None if t is None else grammars.start(t) for t in texts]
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0))
    allowed = grammars.mask(states)
    assert allowed is not None and allowed.rows == [0, 2]
    together = sample(logits, [RowSampling(1.0, 1.0, 0, seed) for seed in (1, 2, 3)], allowed)
    for k, row in enumerate(allowed.rows):
        assert int(together[row]) in _allowed_ids(allowed.bits[k]).tolist()
        alone = sample(logits[row : row + 1], [RowSampling(1.0, 1.0, 0, row + 1)],
                       TokenMask([0], allowed.bits[k : k + 1]))
        assert int(alone[0]) == int(together[row])
    assert int(sample(logits[1:2], [RowSampling(1.0, 1.0, 0, 2)])[0]) == int(together[1])


def test_no_constrained_row_means_no_mask(grammars: Grammars) -> None:
    assert grammars.mask([None, None]) is None
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(0))
    rows = [RowSampling(0.0, 1.0, 0, 1), RowSampling(1.0, 1.0, 0, 2)]
    again = [RowSampling(0.0, 1.0, 0, 1), RowSampling(1.0, 1.0, 0, 2)]
    assert torch.equal(sample(logits, rows, None), sample(logits, again))


def test_allow_only_touches_its_rows_only() -> None:
    logits = torch.randn(3, 70, generator=torch.Generator().manual_seed(0))
    bits = torch.zeros(1, 2, dtype=torch.int32)  # 64 tokens' worth of bits: 64..69 never allowed
    bits[0, 0] = 1 << 5
    bits[0, 1] = -(1 << 31)  # bit 31 of word 1: token 63
    masked = allow_only(logits, TokenMask([1], bits))
    assert torch.equal(masked[0], logits[0]) and torch.equal(masked[2], logits[2])
    assert torch.isfinite(masked[1]).nonzero().flatten().tolist() == [5, 63]
    assert torch.isfinite(logits[1]).all()  # a new tensor: the runner's logits stay as they were


@pytest.mark.parametrize("schema, says", [
    ({"type": "nonsense"}, "nonsense"),
    ({"type": "string", "pattern": "[a-"}, "regex"),
    ({"$ref": "#/$defs/missing"}, "missing"),
])
def test_bad_schemas_are_named(schema: dict, says: str) -> None:
    error = schema_error(schema)
    assert error is not None and says in error
    with pytest.raises(ValueError, match="."):
        grammar_for(JsonOutput(schema), ())


def test_good_schemas_pass() -> None:
    assert schema_error(CITY) is None
    assert schema_error({"type": "object", "properties": {"x": {"$ref": "#/$defs/X"}},
                         "$defs": {"X": {"type": "integer"}}}) is None


def test_a_named_tool_must_exist() -> None:
    with pytest.raises(ValueError, match="no tool named 'nope'"):
        grammar_for(ToolCallOutput("nope"), TOOLS)
