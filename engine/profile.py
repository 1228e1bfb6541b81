"""Deploy profiles: YAML -> frozen, validated config; platform deltas; CLI overrides.

Nothing downstream reads YAML or the environment. A wrong key or value stops
start-up with the key's path, e.g. `stages.talker.max_batch: must be >= 1`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
PLATFORMS = ("cpu", "cuda", "rocm", "xpu", "npu")


class ProfileError(ValueError):
    pass


def _at_least(lo: float) -> dict[str, Any]:
    return {"min": lo}


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    temperature: float = field(default=0.7, metadata=_at_least(0.0))
    top_p: float = field(default=0.8, metadata={"min": 0.0, "max": 1.0})
    top_k: int = field(default=20, metadata=_at_least(0))
    repetition_penalty: float = field(default=1.0, metadata=_at_least(1.0))


# transformers' experts kernels, or ours (engine/accel/fused_moe.py)
MoeImplementation = Literal["auto", "eager", "grouped_mm", "batched_mm", "fused_triton"]
# decode steps: SDPA over a gathered copy of the cache, or ours straight from it (engine/accel/slot_attention.py)
DecodeAttention = Literal["sdpa", "triton"]
# the Talker's code predictor: transformers' modules, or engine/runners/code_predictor.py (plain or torch.compile'd)
CodePredictor = Literal["transformers", "static", "compiled"]


@dataclass(frozen=True, slots=True)
class ThinkerConfig:
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    moe_implementation: MoeImplementation = "auto"
    decode_attention: DecodeAttention = "sdpa"
    max_batch: int = field(default=8, metadata=_at_least(1))
    max_model_len: int = field(default=2048, metadata=_at_least(16))
    default_max_tokens: int = field(default=256, metadata=_at_least(1))
    # padded prompt tokens one prefill forward may take (1: one request per prefill)
    prefill_token_budget: int = field(default=4096, metadata=_at_least(1))
    ignore_eos: bool = False
    enforce_eager: bool = True
    # with graphs on: one-prompt prefills replayed per prompt-length bucket (32..512 tokens);
    # on in the GPU profile (a lone reply's first packet: 0.45 -> 0.10 s on the H200).
    graph_prefill: bool = False
    # ... and groups of prompts too, per (prompts, length) bucket up to `prefill_token_budget` tokens: an
    # eager group forward is ~4000 launches from a host the other stages share (~250-400 ms at c=64)
    graph_prefill_groups: bool = False
    # with graphs on: decoder layers through torch.compile while the decode graphs are captured
    # (fuses each layer's small kernels; compiles at start-up, never while serving)
    compile_decode: bool = False
    # prefill buckets x1.5 apart, not x2 (lengths 32, 48, 64, 96, ...; prompts 1, 2, 3, 4, 6, 8, 12, ...):
    # less padding for about three times the graphs
    fine_prefill_buckets: bool = False
    # with audio out: decode only while some reply's text is fewer than this many tokens ahead of what
    # its Talker has consumed (0: never wait). Text runs ~2x faster than speech; the steps that
    # outrun it only take the GPU from the stages that make the audio.
    pace_text_lead: int = field(default=0, metadata=_at_least(0))
    # with pacing: while some reply's Talker holds all the text its first chunk needs but has not made
    # that chunk, the other replies' text waits at a lead of one, so those first frames run without
    # Thinker steps beside them (a batch-64 Talker frame beside a Thinker step takes about twice as long)
    first_chunk_priority: bool = False
    # with own CUDA streams, this stage's stream priority (lower runs first; CUDA offers 0 to -3). Stages
    # nearer the audio go first by default, so the Thinker, which runs ahead, yields to them.
    stream_priority: int = field(default=0, metadata={"min": -3, "max": 0})
    sampling: SamplingConfig = field(default_factory=SamplingConfig)


@dataclass(frozen=True, slots=True)
class TalkerConfig:
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    moe_implementation: MoeImplementation = "auto"
    decode_attention: DecodeAttention = "sdpa"
    code_predictor: CodePredictor = "transformers"
    max_batch: int = field(default=16, metadata=_at_least(1))
    replicas: int = field(default=1, metadata=_at_least(1))
    max_frames: int = field(default=4096, metadata=_at_least(1))
    max_prefill_batch: int = field(default=64, metadata=_at_least(1))  # prompts per prefill forward
    ignore_eos: bool = False
    enforce_eager: bool = True
    graph_prefill: bool = False  # as the Thinker's
    graph_prefill_groups: bool = False  # as the Thinker's, up to max_prefill_batch prompts
    compile_decode: bool = False  # as the Thinker's
    fine_prefill_buckets: bool = False  # as the Thinker's
    default_speaker: str = "ethan"
    # with own CUDA streams, this stage's stream priority
    stream_priority: int = field(default=-1, metadata={"min": -3, "max": 0})
    sampling: SamplingConfig = field(
        default_factory=lambda: SamplingConfig(temperature=0.9, top_p=1.0, top_k=50, repetition_penalty=1.05)
    )
    code_sampling: SamplingConfig = field(
        default_factory=lambda: SamplingConfig(temperature=0.9, top_p=0.8, top_k=50)
    )


@dataclass(frozen=True, slots=True)
class Code2WavConfig:
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_batch: int = field(default=16, metadata=_at_least(1))
    replicas: int = field(default=1, metadata=_at_least(1))
    enforce_eager: bool = True
    # Carry each reply's decoder state between chunks instead of re-decoding left context
    # (exactly the one-shot decode); `max_streams` replies hold state at once.
    streaming: bool = True
    max_streams: int = field(default=128, metadata=_at_least(1))
    # with own CUDA streams, this stage's stream priority
    stream_priority: int = field(default=-2, metadata={"min": -3, "max": 0})
    # On a GPU, pad streaming steps to fixed (batch, frames) buckets, all met once at start-up:
    # a shape cuDNN first meets under load costs ~200 ms.
    bucket_shapes: bool = True
    # SnakeBeta as one Triton kernel (engine/accel/snake.py) instead of five bf16 ops
    fused_snake: bool = False
    # While some reply waits for its first audio, a reply whose audio already runs more than this many
    # seconds ahead of real time waits too (0: never): its chunk would only slow the prefills and
    # frames that first packet needs (e.g. a finished reply's 22-frame last chunk at batch 43 took
    # 96 ms beside a prefill that it slowed from ~45 to 106 ms on the H200).
    defer_ahead_s: float = field(default=0.0, metadata=_at_least(0))


@dataclass(frozen=True, slots=True)
class ChunkConfig:
    """How codec frames are cut for Code2Wav. Off = one decode when the Talker finishes."""

    enabled: bool = True
    initial_chunk_frames: int = field(default=4, metadata=_at_least(1))
    # sizes of the chunks after the first, before `chunk_frames` takes over (e.g. [8, 16]): while
    # a player's buffer is short, chunks that take less time to make than they play keep it fed
    ramp_frames: tuple[int, ...] = field(default=(), metadata=_at_least(1))
    chunk_frames: int = field(default=25, metadata=_at_least(1))
    left_context_frames: int = field(default=25, metadata=_at_least(1))  # unused when code2wav.streaming

    def size(self, index: int) -> int:
        """Frames in a reply's chunk number `index` (0 = the first)."""
        schedule = (self.initial_chunk_frames, *self.ramp_frames)
        return schedule[index] if index < len(schedule) else self.chunk_frames

    def sizes(self) -> tuple[int, ...]:
        return tuple(sorted({self.initial_chunk_frames, *self.ramp_frames, self.chunk_frames}))


@dataclass(frozen=True, slots=True)
class StagesConfig:
    thinker: ThinkerConfig = field(default_factory=ThinkerConfig)
    talker: TalkerConfig = field(default_factory=TalkerConfig)
    code2wav: Code2WavConfig = field(default_factory=Code2WavConfig)
    # each stage queues its GPU work on its own CUDA stream (off: all share the default stream).
    # Off by default: one H200 run with it on stalled (benchmarks/h200/NOTES.md, rung 8).
    own_cuda_streams: bool = False
    # Python's GIL switch interval while the stage threads run (0: Python's own, 5 ms). A stage thread
    # gives the GIL back at every torch call and then waits for it, up to the whole interval while
    # another thread runs pure Python (the event loop's JSON, another stage's bookkeeping).
    gil_switch_interval_ms: float = field(default=0.0, metadata=_at_least(0.0))


@dataclass(frozen=True, slots=True)
class DeployProfile:
    name: str
    model: str = "tiny"
    load_format: Literal["auto", "dummy"] = "auto"
    # staged: our engine; transformers_generate: the library's generate(return_audio=True), the benchmark baseline
    backend: Literal["staged", "transformers_generate"] = "staged"
    stages: StagesConfig = field(default_factory=StagesConfig)
    async_chunk: ChunkConfig = field(default_factory=ChunkConfig)
    # run the engine (orchestrator and stage threads) in a child process with its own GIL, so the
    # server's event loop never waits on the stage threads for it (engine/process.py)
    engine_process: bool = False
    # server processes in front of the engine (`serve --http-workers` beats it); more than one puts the
    # engine in a process of its own, which they all attach to
    http_workers: int = field(default=1, metadata=_at_least(1))


def detect_platform() -> str:
    import torch

    if torch.cuda.is_available():
        return "rocm" if torch.version.hip else "cuda"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    return "cpu"


def default_profile_path(model: str) -> Path:
    return CONFIG_DIR / ("tiny.yaml" if model == "tiny" else "qwen3_omni_moe.yaml")


def load_profile(
    path: Path | None = None,
    *,
    model: str = "tiny",
    platform: str | None = None,
    stage_overrides: str | dict[str, Any] | None = None,
) -> DeployProfile:
    """Read a profile, merge its delta for `platform`, then the CLI's stage overrides."""
    path = path or default_profile_path(model)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ProfileError(f"{path}: {e}") from e
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: top level must be a mapping")
    raw = copy.deepcopy(raw)
    raw.setdefault("name", path.stem)
    deltas = raw.pop("platforms", None) or {}
    _check_mapping(deltas, "platforms")
    for key in deltas:
        if key not in PLATFORMS:
            raise ProfileError(f"platforms.{key}: unknown platform (expected one of {', '.join(PLATFORMS)})")
    platform = platform or detect_platform()
    raw = _deep_merge(raw, deltas.get(platform) or {}, f"platforms.{platform}")
    if stage_overrides:
        if isinstance(stage_overrides, str):
            try:
                stage_overrides = json.loads(stage_overrides)
            except json.JSONDecodeError as e:
                raise ProfileError(f"--stage-overrides: not valid JSON ({e})") from e
        _check_mapping(stage_overrides, "--stage-overrides")
        raw["stages"] = _deep_merge(raw.get("stages") or {}, stage_overrides, "stages")
    return _build(DeployProfile, raw, "")


def _check_mapping(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: must be a mapping, got {type(value).__name__}")


def _deep_merge(base: dict[str, Any], delta: dict[str, Any], where: str) -> dict[str, Any]:
    _check_mapping(delta, where)
    out = dict(base)
    for key, value in delta.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value, f"{where}.{key}")
        else:
            out[key] = value
    return out


def _build(cls: type, raw: Any, path: str) -> Any:
    _check_mapping(raw, path or "profile")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in raw.items():
        key_path = f"{path}.{key}" if path else str(key)
        if key not in fields:
            raise ProfileError(f"{key_path}: unknown key (expected one of {', '.join(fields)})")
        kwargs[key] = _coerce(hints[key], value, fields[key].metadata, key_path)
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, meta: Any, path: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, path)
    origin = typing.get_origin(hint)
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise ProfileError(f"{path}: must be one of {', '.join(map(str, allowed))}, got {value!r}")
        return value
    if origin is tuple:  # tuple[X, ...], written as a YAML list
        if not isinstance(value, list):
            raise ProfileError(f"{path}: must be a list, got {value!r}")
        (item,) = (arg for arg in typing.get_args(hint) if arg is not Ellipsis)
        return tuple(_coerce(item, v, meta, f"{path}[{i}]") for i, v in enumerate(value))
    if origin in (typing.Union, types.UnionType):
        raise AssertionError(f"unions are not used in profiles: {path}")
    if hint is bool:
        if not isinstance(value, bool):
            raise ProfileError(f"{path}: must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProfileError(f"{path}: must be an integer, got {value!r}")
    elif hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProfileError(f"{path}: must be a number, got {value!r}")
        value = float(value)
    elif hint is str:
        if not isinstance(value, str) or not value:
            raise ProfileError(f"{path}: must be a non-empty string, got {value!r}")
        return value
    if "min" in meta and value < meta["min"]:
        raise ProfileError(f"{path}: must be >= {meta['min']}, got {value}")
    if "max" in meta and value > meta["max"]:
        raise ProfileError(f"{path}: must be <= {meta['max']}, got {value}")
    return value
