"""The cascade's language model (engine/cascade/brain.py): built once from its package's GGUF file, stepped in
packed batches over KV slots as the Thinker is, and it answers what it is asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.cascade import brain
from engine.cascade.brain import BrainRunner
from engine.omni.runners.thinker import StepRow

SYSTEM = "You are a helpful voice assistant. Answer in one short sentence."


@pytest.fixture(scope="module")
def loaded(cache_dir: Path) -> tuple[Any, Any]:
    return brain.load(cache_dir)


def prompt(tokenizer: Any, question: str) -> list[int]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def test_the_checkpoint_is_built_once(loaded: tuple[Any, Any], cache_dir: Path) -> None:
    path = brain.checkpoint(cache_dir)
    weights = path / "model.safetensors"
    made = weights.stat().st_mtime_ns
    assert brain.checkpoint(cache_dir) == path and weights.stat().st_mtime_ns == made
    assert not (path / "config.json").read_text().count("quantization_config")


def test_a_packed_batch_answers_each_question(loaded: tuple[Any, Any]) -> None:
    model, tokenizer = loaded
    questions = {"What is the capital of France?": "paris", "How many legs does a spider have?": "8",
                 "What colour is the sky on a clear day?": "blue"}
    prompts = [prompt(tokenizer, q) for q in questions]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with torch.inference_mode():
        runner = BrainRunner(model, max_batch=4, max_len=256)
        outs = runner.step([StepRow(i, ids) for i, ids in enumerate(prompts)])
        positions = [len(ids) for ids in prompts]
        replies: list[list[int]] = [[] for _ in prompts]
        for _ in range(24):  # greedy, every reply a row of one step
            tokens = [int(out.logits.argmax()) for out in outs]
            for reply, token in zip(replies, tokens, strict=True):
                reply.append(token)
            outs = runner.step([StepRow(i, [t], positions[i]) for i, t in enumerate(tokens)])
            positions = [p + 1 for p in positions]
    for (question, expected), reply in zip(questions.items(), replies, strict=True):
        text = tokenizer.decode(reply[: reply.index(end)] if end in reply else reply)
        assert expected in text.lower(), (question, text)
        assert outs[0].embeds.shape[1] == 0  # the voice takes text, not rows


def test_rows_after_a_kept_prefix_equal_a_whole_prefill(loaded: tuple[Any, Any]) -> None:
    model, tokenizer = loaded
    ids = prompt(tokenizer, "Tell me something about the sea.")
    cut = len(ids) // 2
    with torch.inference_mode():
        runner = BrainRunner(model, max_batch=3, max_len=128)
        whole = runner.step([StepRow(0, ids)])[0].logits
        runner.step([StepRow(1, ids[:cut])])
        other = prompt(tokenizer, "Hello!")
        rest = runner.step([StepRow(2, other), StepRow(1, ids[cut:], cut)])[1].logits
    torch.testing.assert_close(rest, whole, rtol=1e-4, atol=1e-4)
