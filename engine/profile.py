"""Deploy profiles: YAML -> frozen, validated config; platform deltas; CLI overrides.

Nothing downstream reads YAML or the environment. A wrong key or value stops
start-up with the key's path, e.g. `stages.talker.max_batch: must be >= 1`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
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


Dtype = Literal["float32", "bfloat16", "float16"]


@dataclass(frozen=True, slots=True)
class ThinkerConfig:
    device: str = "cpu"
    dtype: Dtype = "float32"
    max_batch: int = field(default=8, metadata=_at_least(1))
    max_model_len: int = field(default=2048, metadata=_at_least(16))
    default_max_tokens: int = field(default=256, metadata=_at_least(1))
    # tokens one step may carry, prompt pieces and a row per running reply (and the largest graph)
    max_step_tokens: int = field(default=2048, metadata=_at_least(1))
    # the KV cache's positions for all slots together (engine/omni/runners/kv_cache.py); 0: max_batch x
    # max_model_len, every slot its whole length. Less, and slots share the pool: a request reserves its prompt
    # and its longest reply when it starts, so more slots fit beside the weights (128 voices on one GPU)
    kv_cache_tokens: int = field(default=0, metadata=_at_least(0))
    # host memory for kept prefixes whose slots were needed (engine/omni/runners/prefix_cache.py); 0: none kept
    kept_prefix_host_gib: float = field(default=1.0, metadata=_at_least(0.0))
    # an image is resized to within these pixels (each prompt token stands for 32x32 of them): at most 400 tokens
    # (a 1280x720 camera frame takes 390), at least 4
    image_min_pixels: int = field(default=4 * 32 * 32, metadata=_at_least(4 * 32 * 32))
    image_max_pixels: int = field(default=400 * 32 * 32, metadata=_at_least(4 * 32 * 32))
    # a video's frames, each resized to within this many pixels: 64 tokens for each pair of frames, one a second
    # at the edge's 2 frames a second (a 16-frame, 8 s clip takes 512 tokens)
    video_frame_max_pixels: int = field(default=64 * 32 * 32, metadata=_at_least(4 * 32 * 32))
    # pictures whose size (WIDTHxHEIGHT) the vision tower is graphed for at start-up on a GPU: the cameras' and
    # phones' common frames and photos, each way up; a picture of another size runs the tower eagerly
    image_graph_sizes: tuple[str, ...] = ("1280x720", "720x1280", "640x480", "480x640", "4032x3024", "3024x4032")
    ignore_eos: bool = False
    sampling: SamplingConfig = field(default_factory=SamplingConfig)

    @property
    def image_graph_shapes(self) -> list[tuple[int, int]]:
        """`image_graph_sizes` as (height, width)."""
        return [(int(h), int(w)) for w, h in (size.split("x") for size in self.image_graph_sizes)]

    def __post_init__(self) -> None:
        for size in self.image_graph_sizes:
            if not re.fullmatch(r"[1-9]\d*x[1-9]\d*", size):
                raise ProfileError(f"stages.thinker.image_graph_sizes: each is WIDTHxHEIGHT in pixels, got {size!r}")
        # a step carries a row for every running reply and still prefills (engine/omni/stages/policy.py)
        if self.max_step_tokens < self.max_batch + 64:
            raise ProfileError(f"stages.thinker.max_step_tokens: must be >= max_batch + 64 ({self.max_batch + 64}), "
                               f"got {self.max_step_tokens}")
        if 0 < self.kv_cache_tokens < self.max_model_len:
            raise ProfileError(f"stages.thinker.kv_cache_tokens: must hold one sequence of max_model_len "
                               f"({self.max_model_len}), got {self.kv_cache_tokens}")


@dataclass(frozen=True, slots=True)
class TalkerConfig:
    device: str = "cpu"
    dtype: Dtype = "float32"
    max_batch: int = field(default=16, metadata=_at_least(1))
    copies: int = field(default=1, metadata=_at_least(1))  # the stage's copies in this engine, sharing its weights
    max_frames: int = field(default=4096, metadata=_at_least(1))
    # the Talker's KV positions for all slots together; 0: every slot its whole reply (`StagesConfig.talker_max_len`).
    # Less, and slots share the pool: a reply reserves its prompt's rows and `max_frames` when its prefill starts,
    # so a prompt shorter than max_model_len holds no KV for the rest (20 KiB a row on the released model)
    kv_cache_tokens: int = field(default=0, metadata=_at_least(0))
    # rows one step may carry: a row per speaking reply, prompt pieces in the rest (and the largest graph)
    max_step_tokens: int = field(default=2048, metadata=_at_least(1))
    ignore_eos: bool = False
    default_speaker: str = "ethan"
    sampling: SamplingConfig = field(
        default_factory=lambda: SamplingConfig(temperature=0.9, top_p=1.0, top_k=50, repetition_penalty=1.05)
    )
    code_sampling: SamplingConfig = field(
        default_factory=lambda: SamplingConfig(temperature=0.9, top_p=0.8, top_k=50)
    )

    def __post_init__(self) -> None:
        if self.max_step_tokens < self.max_batch + 64:
            raise ProfileError(f"stages.talker.max_step_tokens: must be >= max_batch + 64 ({self.max_batch + 64}), "
                               f"got {self.max_step_tokens}")


@dataclass(frozen=True, slots=True)
class Code2WavConfig:
    device: str = "cpu"
    dtype: Dtype = "float32"
    max_batch: int = field(default=16, metadata=_at_least(1))
    copies: int = field(default=1, metadata=_at_least(1))  # the stage's copies in this engine, sharing its weights
    max_streams: int = field(default=128, metadata=_at_least(1))  # replies holding decoder state at once
    # frames one step decodes (its chunks x its widest chunk: the padded batch), so that no step holds the GPU
    # long while other stages' replies wait; a step always takes at least one chunk
    max_step_frames: int = field(default=800, metadata=_at_least(1))


@dataclass(frozen=True, slots=True)
class ChunkConfig:
    """How codec frames are cut for Code2Wav. Off = one decode when the Talker finishes."""

    enabled: bool = True
    initial_chunk_frames: int = field(default=4, metadata=_at_least(1))
    # sizes of the chunks after the first, before `chunk_frames` takes over (e.g. [4, 6, 8]): while
    # a player's buffer is short, chunks that take less time to make than they play keep it fed
    ramp_frames: tuple[int, ...] = field(default=(), metadata=_at_least(1))
    chunk_frames: int = field(default=25, metadata=_at_least(1))

    def size(self, index: int) -> int:
        """Frames in a reply's chunk number `index` (0 = the first)."""
        schedule = (self.initial_chunk_frames, *self.ramp_frames)
        return schedule[index] if index < len(schedule) else self.chunk_frames

    def sizes(self) -> tuple[int, ...]:
        return tuple(sorted({self.initial_chunk_frames, *self.ramp_frames, self.chunk_frames}))


@dataclass(frozen=True, slots=True)
class FirstPacketConfig:
    """How the stages make room for a reply's first audio (engine/omni/stages/policy.py)."""

    # > 0: the Thinker decodes only while some reply's text is fewer than this many tokens ahead of its
    # speech, and makes a waiting reply's first-chunk text first (0: it decodes whenever it can)
    text_lead: int = field(default=0, metadata=_at_least(0))


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """How the Omni engine sizes itself to its GPU (engine/omni/memory.py): the share of the card it may use (vLLM's
    `gpu_memory_utilization`), what start-up holds beyond weights and KV pools, and the replies `quantization: auto`
    keeps bf16 experts for (`max_batch` of `typical_positions`)."""

    gpu_memory_utilization: float = field(default=0.90, metadata={"min": 0.05, "max": 1.0})
    # the Thinker's and Talker's graphs, activations, workspaces, the decoders' streaming state and CUDA's own: what
    # the full-size GPU profile holds after start-up beyond its weights, pools and Code2Wav's graphs (which the plan
    # counts by its step; docs/deployment.md, "Which card")
    reserve_gib: float = field(default=4.0, metadata=_at_least(0.0))
    typical_positions: int = field(default=2048, metadata=_at_least(16))
    # the card as the engine may use it: less than its own memory caps the process there (a card shared with other
    # work, or a smaller card's plan tried on a larger one); 0: the whole card
    card_gib: float = field(default=0.0, metadata=_at_least(0.0))


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """How many replies run at once, and how many more wait and for how long (engine/gate.py)."""

    # 0: the stages' smallest batch; less keeps replies in real time where the batch alone does not
    max_active: int = field(default=0, metadata=_at_least(0))
    max_queued: int = field(default=64, metadata=_at_least(0))
    # past it a waiting request is refused (overloaded), so none waits longer for its first audio
    queue_timeout_s: float = field(default=0.1, metadata=_at_least(0.0))
    # the same for a turn of a live conversation (`EngineRequest.live_turn`), whose caller cannot try again: long
    # enough for places to free as running replies make their last audio, so a burst of turns is answered late
    # rather than lost; short enough that a server stuck full still answers the turn (failed) while its caller waits.
    # Never less than `queue_timeout_s`: a longer one holds for live turns too
    live_queue_timeout_s: float = field(default=5.0, metadata=_at_least(0.0))


@dataclass(frozen=True, slots=True)
class SupervisionConfig:
    """How an engine in another process is kept serving (remote/client.py): it speaks four times a second."""

    # silence after which the engine process counts as stalled: its requests fail with
    # engine_unavailable, and it is killed and started again
    stall_timeout_s: float = field(default=10.0, metadata=_at_least(1.0))
    # the wait before the first attempt to start a lost engine process again; it doubles with each
    # attempt, up to `restart_backoff_max_s`, and starts over once a process has served that long
    restart_backoff_s: float = field(default=1.0, metadata=_at_least(0.1))
    restart_backoff_max_s: float = field(default=30.0, metadata=_at_least(0.1))

    def __post_init__(self) -> None:
        if self.restart_backoff_max_s < self.restart_backoff_s:
            raise ProfileError(f"engine.supervision.restart_backoff_max_s: must be >= restart_backoff_s "
                               f"({self.restart_backoff_s}), got {self.restart_backoff_max_s}")

    def backoff_s(self, attempt: int) -> float:
        """The wait before restart attempt number `attempt` of a run of them (0 = the first)."""
        return min(self.restart_backoff_s * 2 ** min(attempt, 32), self.restart_backoff_max_s)


@dataclass(frozen=True, slots=True)
class ReplicasConfig:
    """Several engines behind one server, each a Ray actor in its own process (`engine.where: ray` only)."""

    count: int = field(default=1, metadata=_at_least(1))
    # Ray's address: "local" starts a Ray instance for this server alone; "auto" joins the one that
    # `ray start --head` runs on this host; "HOST:PORT" (or "ray://HOST:PORT") a cluster's head
    address: str = "local"
    # what each replica asks of Ray: its CPUs (its torch threads) and GPUs (1 on a GPU host)
    cpus: float = field(default=1.0, metadata=_at_least(0.0))
    gpus: float = field(default=0.0, metadata=_at_least(0.0))


@dataclass(frozen=True, slots=True)
class TopologyConfig:
    """Where the engine runs, how many server processes are in front of it, and how it is kept serving."""

    # in_process: the stages in the server's process; process: in a child of its own, with its own GIL, so
    # the server's event loop never waits on them for it (engine/remote/); ray: `replicas` engines, each a
    # Ray actor (engine/replicas/)
    where: Literal["in_process", "process", "ray"] = "in_process"
    # server processes in front of the engine (`serve --http-workers` beats it); more than one puts an
    # in_process engine in a process of its own, which they all attach to (with ray, they share the replicas)
    http_workers: int = field(default=1, metadata=_at_least(1))
    replicas: ReplicasConfig = field(default_factory=ReplicasConfig)
    supervision: SupervisionConfig = field(default_factory=SupervisionConfig)

    def __post_init__(self) -> None:
        if self.where != "ray" and self.replicas != ReplicasConfig():
            raise ProfileError(f"engine.replicas: only with engine.where: ray, got where: {self.where}")

    def in_one_process(self) -> TopologyConfig:
        """This topology for the engine process itself: its stages run where it runs, for one server."""
        return TopologyConfig(supervision=self.supervision)


@dataclass(frozen=True, slots=True)
class BrainConfig:
    """The cascade's language model: replies at once, their context, length and sampling where a request is silent."""

    max_batch: int = field(default=8, metadata=_at_least(1))
    max_model_len: int = field(default=4096, metadata=_at_least(16))
    default_max_tokens: int = field(default=96, metadata=_at_least(1))
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=0.3, top_p=0.9, top_k=40))


@dataclass(frozen=True, slots=True)
class CascadeConfig:
    """The assistant cascade's roles: who listens (`ears`), who answers (`brain`), who speaks (`voice`). The ears and
    the voice are the pinned registry packages' or the fallbacks (pocketsphinx's wheel, Debian's festival), which
    keep the profile serving if a package disappears; the language model has no fallback."""

    ears: Literal["whisper", "pocketsphinx"] = "whisper"
    brain: BrainConfig = field(default_factory=BrainConfig)
    voice: Literal["piper", "festival"] = "piper"


@dataclass(frozen=True, slots=True)
class StagesConfig:
    thinker: ThinkerConfig = field(default_factory=ThinkerConfig)
    talker: TalkerConfig = field(default_factory=TalkerConfig)
    code2wav: Code2WavConfig = field(default_factory=Code2WavConfig)

    def __post_init__(self) -> None:
        if 0 < self.talker.kv_cache_tokens < self.talker_max_len:
            raise ProfileError(f"stages.talker.kv_cache_tokens: must hold one reply of thinker.max_model_len + "
                               f"talker.max_frames + 16 ({self.talker_max_len}), got {self.talker.kv_cache_tokens}")

    @property
    def talker_max_len(self) -> int:
        """The rows a reply's Talker sequence can reach: its user turns, the assistant part, a row per frame."""
        return self.thinker.max_model_len + self.talker.max_frames + 16


@dataclass(frozen=True, slots=True)
class DeployProfile:
    name: str
    model: str = "tiny"
    load_format: Literal["auto", "dummy"] = "auto"
    # omni: the staged Qwen3-Omni engine (engine/omni/); transformers_generate: the library's
    # generate(return_audio=True) on the same checkpoint, the benchmark baseline; cascade: the assistant's small
    # listen -> think -> speak models (engine/cascade/), in process, on the CPU, set by the `cascade` section
    backend: Literal["omni", "transformers_generate", "cascade"] = "omni"
    engine: TopologyConfig = field(default_factory=TopologyConfig)
    # on CUDA stages: decode steps, prefills, the code predictor and Code2Wav replayed from CUDA graphs,
    # decoder layers and the code predictor through torch.compile (all at start-up, never while serving)
    cuda_graphs: bool = False
    # triton: our fused MoE, decode attention from the slot KV cache and SnakeBeta (engine/omni/accel/);
    # reference: transformers' own modules
    kernels: Literal["reference", "triton"] = "reference"
    # fp8: the Thinker's and Talker's experts as e4m3 with block scales (engine/omni/accel/fp8.py), quantized at
    # load, their inputs quantized per row as they arrive; read by the triton kernels only. auto: on a GPU, bf16
    # where the card holds `max_batch` replies of `memory.typical_positions` beside them, else fp8 where the
    # triton kernels run (the memory plan); elsewhere none
    quantization: Literal["none", "fp8", "auto"] = "none"
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    first_packet: FirstPacketConfig = field(default_factory=FirstPacketConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    stages: StagesConfig = field(default_factory=StagesConfig)
    async_chunk: ChunkConfig = field(default_factory=ChunkConfig)
    cascade: CascadeConfig = field(default_factory=CascadeConfig)

    def __post_init__(self) -> None:
        devices = (self.stages.thinker.device, self.stages.talker.device, self.stages.code2wav.device)
        if self.cuda_graphs and not all(d.startswith("cuda") for d in devices):
            raise ProfileError(f"cuda_graphs: needs every stage on a CUDA device, got {', '.join(devices)}")
        if self.quantization == "fp8" and (self.kernels != "triton" or self.backend != "omni"):
            raise ProfileError("quantization: fp8 needs kernels: triton and backend: omni (the fused MoE "
                               "kernels read FP8 experts)")
        if self.backend == "transformers_generate" and self.engine.where != "in_process":
            raise ProfileError(f"engine.where: the transformers_generate baseline runs in_process, got {self.engine.where}")
        if self.backend != "cascade" and self.cascade != CascadeConfig():
            raise ProfileError(f"cascade: only with backend: cascade, got backend: {self.backend}")
        if self.backend == "cascade" and self.stages != StagesConfig():
            raise ProfileError("stages: the cascade's stages are set by cascade.ears, cascade.brain and cascade.voice")

    @property
    def runs_in_process(self) -> bool:
        """The engine runs in the server's own process, and that process is the only one."""
        return self.engine.where == "in_process" and self.engine.http_workers == 1

    def in_one_process(self) -> DeployProfile:
        """The profile an engine process runs: its stages where it runs, for one server (what keeps it serving
        stays, for the server processes that attach to learn)."""
        return dataclasses.replace(self, engine=self.engine.in_one_process())


def detect_platform() -> str:
    import torch

    if torch.cuda.is_available():
        return "rocm" if torch.version.hip else "cuda"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    return "cpu"


def default_profile_path(model: str) -> Path:
    return CONFIG_DIR / {"tiny": "tiny.yaml", "assistant": "assistant.yaml"}.get(model, "qwen3_omni_moe.yaml")


def load_profile(
    path: Path | None = None,
    *,
    model: str = "tiny",
    platform: str | None = None,
    stage_overrides: str | dict[str, Any] | None = None,
    overrides: str | dict[str, Any] | None = None,
) -> DeployProfile:
    """A profile, its `platform` delta merged, then the CLI's stage overrides, then `--overrides` of any key."""
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
        stages = _json_mapping(stage_overrides, "--stage-overrides")
        raw["stages"] = _deep_merge(raw.get("stages") or {}, stages, "stages")
    if overrides:
        raw = _deep_merge(raw, _json_mapping(overrides, "--overrides"), "")
    return _build(DeployProfile, raw, "")


def _json_mapping(value: str | dict[str, Any], where: str) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ProfileError(f"{where}: not valid JSON ({e})") from e
    _check_mapping(value, where)
    assert isinstance(value, dict)
    return value


def _check_mapping(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: must be a mapping, got {type(value).__name__}")


def _deep_merge(base: dict[str, Any], delta: dict[str, Any], where: str) -> dict[str, Any]:
    _check_mapping(delta, where)
    out = dict(base)
    for key, value in delta.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value, f"{where}.{key}" if where else key)
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
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
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
