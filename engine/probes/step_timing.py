"""What a Thinker step costs as the conversations it serves grow (`voice-gateway steps`).

Every decode row reads its whole context's KV in every layer, which is what grows with a long call's history;
a turn's new prompt tokens attend over their whole history too. This times the Thinker's step as the engine runs
it (graph replayed where a bucket fits, host layout and output copies included) for `rows` decode rows, each the
next position of a slot holding `context - 1`, beside `prompt` prompt tokens in pieces of `PIECE` after `context`
positions of their own slots. The keys' values do not change the time, so the slots hold whatever their pages did."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from engine.omni.accel.cuda_graphs import thinker_capture
from engine.omni.accel.packed_attention import KernelAttention
from engine.omni.accel.prepare import load_stage
from engine.omni.runners.thinker import StepRow, ThinkerRunner
from engine.omni.weights.source import ModelSource

ROWS = (1, 16, 32, 64)
CONTEXTS = (256, 2048, 4096, 8192)
PROMPTS = (0, 1024)
PIECE = 128  # a prompt piece: about what a spoken turn adds (its audio and the reply before it)
WARM_STEPS = 3


@dataclass(frozen=True, slots=True)
class StepTiming:
    rows: int  # decode rows in the step
    context: int  # positions each row attends over, and each prompt piece after its own
    prompt: int  # prompt tokens beside the rows, in pieces of PIECE
    step_ms: float  # one step, from its call until the device has finished it: the median over the replays
    kv_gb: float  # the keys and values its decode rows read over all layers

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def measure(model: str = "tiny", *, load_format: str = "auto", device: str = "cpu", quantization: str = "none",
            rows: tuple[int, ...] = ROWS, contexts: tuple[int, ...] = CONTEXTS, prompts: tuple[int, ...] = PROMPTS,
            replays: int = 20, cache_dir: Path | None = None) -> list[StepTiming]:
    """Every (rows, context, prompt) of `model`'s Thinker on `device`: on a GPU in bf16 with the Triton kernels
    and a graph for every bucket up to the largest step (compiled layers), as the GPU profile serves; on the CPU
    in float32, eagerly (how the tests run it). `prompts` are multiples of PIECE."""
    if any(p % PIECE for p in prompts):
        raise ValueError(f"prompt tokens come in pieces of {PIECE}, not {prompts}")
    on_gpu = device.startswith("cuda")
    source = ModelSource.open(model, load_format, cache_dir)  # type: ignore[arg-type]
    thinker = load_stage(source, "thinker", device, "bfloat16" if on_gpu else "float32", triton=on_gpu,
                         quantization=quantization)
    with torch.inference_mode():
        runner = ThinkerRunner(thinker, source.config, max_batch=max(rows) + max(prompts) // PIECE,
                               max_len=max(contexts) + PIECE, attention=KernelAttention.on(device) if on_gpu else None,
                               capture=thinker_capture(max(rows) + max(prompts)) if on_gpu else None)
        return [_timing(runner, n, context, prompt, replays) for prompt in prompts for n in rows for context in contexts]


def _timing(runner: ThinkerRunner, rows: int, context: int, prompt: int, replays: int) -> StepTiming:
    kv = runner.kv
    slots = [kv.allocate() for _ in range(rows + prompt // PIECE)]
    for i, slot in enumerate(slots):
        assert kv.reserve(slot, context + (PIECE if i >= rows else 0)), (rows, context, prompt, "too few positions")
    step = [StepRow(slot, [0], context - 1) for slot in slots[:rows]]
    step += [StepRow(slot, [0] * PIECE, context) for slot in slots[rows:]]
    times = []
    for i in range(WARM_STEPS + replays):
        _sync(runner.device)
        started = time.perf_counter()
        runner.step(step)
        _sync(runner.device)
        if i >= WARM_STEPS:
            times.append(time.perf_counter() - started)
    for slot in reversed(slots):  # the free list as it was
        kv.free(slot)
    return StepTiming(rows, context, prompt, round(1e3 * statistics.median(times), 3),
                      round(rows * context * kv.position_bytes / 1e9, 6))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
