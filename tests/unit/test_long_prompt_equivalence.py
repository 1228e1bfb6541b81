"""A long prompt prefilled piece by piece beside a speaking reply equals transformers' own pipeline on it.

The tiny engine on the CPU with steps of at most 80 tokens (max_batch 16): one reply already speaks (its first
audio chunk is out) and still makes text when a prompt of a few hundred tokens arrives, so that prompt goes in
pieces, each in a step beside the speaking reply's decode row. Its text and audio must be exactly what
`generate(return_audio=True)` gives for it alone (greedy, fp32; tests/equivalence.py). The codec frames are
not exposed by the engine; equal audio stands for them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from equivalence import FRAMES, TEXT_TOKENS, assert_equals_generate

from engine import AudioChunk, EngineRequest, Message, SamplingParams, TextDelta, TextPart, create_engine
from engine.profile import load_profile

MAX_STEP_TOKENS = 80
SPEAKER_TOKENS = 300  # the speaking reply's text outlasts the long prompt's prefill, however the threads run
LONG = "Please describe, in a few careful words, the colour of the evening sea and the sky above it. " * 14


Steps = list[tuple[list[str], list[str], int]]  # per step: its pieces' requests, its replies', its tokens


async def _run(cache_dir: Path) -> tuple[list[int], list[int], list[np.ndarray], Steps, Steps]:
    greedy = {"temperature": 0}
    profile = load_profile(model="tiny", platform="cpu", stage_overrides={
        "thinker": {"max_batch": 16, "max_step_tokens": MAX_STEP_TOKENS},
        "talker": {"max_batch": 16, "max_step_tokens": MAX_STEP_TOKENS, "max_frames": FRAMES, "sampling": greedy,
                   "code_sampling": greedy},
    })
    engine = create_engine("tiny", profile, cache_dir)
    thinker = engine.core.core.stages["thinker"]
    steps: Steps = []
    runner_step = thinker.runner.step

    def watched(rows):
        pieces = len(rows) - len(thinker.running)
        batch = list(thinker.last_batch)
        steps.append((batch[:pieces], batch[pieces:], sum(len(r.token_ids) for r in rows)))
        return runner_step(rows)

    thinker.runner.step = watched
    talker = engine.core.core.stages["talker"]
    talker_steps: list[tuple[list[str], list[str], int]] = []
    talker_step = talker.runner.step

    def talker_watched(rows):
        batch = list(talker.last_batch)  # a piece's reply stays pending until its prompt is all in
        talker_steps.append(([r for r in batch if r in talker.pending], [r for r in batch if r in talker.running],
                             sum(r.embeds.shape[0] for r in rows)))
        return talker_step(rows)

    talker.runner.step = talker_watched
    await engine.start()
    try:
        speaking = asyncio.Event()

        async def speaker() -> None:
            request = EngineRequest("speaker", (Message("user", (TextPart("Hello there"),)),), True, "ethan",
                                    SamplingParams(max_tokens=SPEAKER_TOKENS, temperature=0))
            async for event in await engine.submit(request):
                if isinstance(event, AudioChunk):
                    speaking.set()

        async def long() -> tuple[list[int], list[int], list[np.ndarray]]:
            await speaking.wait()
            request = EngineRequest("long", (Message("user", (TextPart(LONG),)),), True, "ethan",
                                    SamplingParams(max_tokens=TEXT_TOKENS, temperature=0))
            tokens, audio = [], []
            async for event in await engine.submit(request):
                if isinstance(event, TextDelta):
                    tokens += event.token_ids
                elif isinstance(event, AudioChunk):
                    audio.append(event.samples)
            return engine.intake.prompts.build(request.messages).token_ids, tokens, audio

        speaking_reply = asyncio.create_task(speaker())
        prompt_ids, tokens, audio = await asyncio.wait_for(long(), timeout=120)
        assert not speaking_reply.done(), "the speaking reply ended before the long prompt's reply"
        speaking_reply.cancel()  # the rest of its text is not needed
        return prompt_ids, tokens, audio, steps, talker_steps
    finally:
        await engine.stop()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_long_prompt_in_pieces_beside_a_speaking_reply_equals_generate(tiny_checkpoint: Path,
                                                                          cache_dir: Path) -> None:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    prompt_ids, tokens, audio, steps, talker_steps = asyncio.run(_run(cache_dir))
    pieces = [(replies, n) for prompts, replies, n in steps if "long" in prompts]
    assert len(prompt_ids) > 3 * MAX_STEP_TOKENS
    assert len(pieces) >= 4, pieces  # several pieces, every step within its budget
    assert all(n <= MAX_STEP_TOKENS for _, _, n in steps)
    assert all("speaker" in replies for replies, _ in pieces), "the speaking reply rode every piece's step"
    # the Talker's prompt (the long user turn) went in pieces too (the speaking reply rides those steps whose
    # moment its next text row is here: that is up to the threads)
    assert sum("long" in prompts for prompts, _, _ in talker_steps) >= 3
    assert all(n <= MAX_STEP_TOKENS for _, _, n in talker_steps)
    reference = Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_checkpoint).eval()
    assert_equals_generate(reference, "cpu", prompt_ids, tokens, audio)
