"""The Omni engine's memory plan on one GPU: the experts' precision, Code2Wav's widest step, and the KV pools sized
to the card.

As vLLM does: the weights' size is known before they load, what start-up holds beyond weights and pools (graphs,
activations, workspaces) is held back (`reserve_gib`, and Code2Wav's graphs, which grow with its widest step), and
the rest of `gpu_memory_utilization` x the card goes to the Thinker's and the Talker's pools, split as a reply of the
whole context takes them (n Thinker positions, n + max_frames + 16 Talker rows) and never beyond every slot's whole
length; explicit `kv_cache_tokens` win. `quantization: auto` keeps bf16 experts where `max_batch` replies of
`typical_positions` fit beside them, else FP8; where even FP8 leaves them no room, Code2Wav's step narrows (to four
of its widest chunks at the least) before the pools do. A card that cannot hold the weights and one sequence of
`max_model_len` is refused before anything loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.api import EngineError
from engine.omni.weights.checkpoint import stage_class
from engine.omni.weights.source import ModelSource
from engine.profile import DeployProfile

GIB = 2**30
TALKER_HEADER_ROWS = 16  # a Talker reply's rows beyond its prompt's and its frames' (its assistant header)
BF16_BYTES = 2
FP8_BYTES = 1  # e4m3; its block scales (one float per 128 x 128) are within the reserve
# Code2Wav's graphs' pool per frame of its widest step: its upsampling convolutions' activations (an 800-frame step
# held 7.5 GiB on an H100, benchmarks/h100/as-shipped/memory.txt)
CODE2WAV_FRAME_BYTES = int(7.5 * GIB / 800)


@dataclass(frozen=True, slots=True)
class StageParams:
    """A stage's parameters, counted on the meta device: its experts' and the rest's."""

    experts: int
    rest: int

    def bytes(self, fp8_experts: bool) -> int:
        return self.experts * (FP8_BYTES if fp8_experts else BF16_BYTES) + self.rest * BF16_BYTES


@dataclass(frozen=True, slots=True)
class Card:
    """The GPU the stages share: its name, its memory, and what other users (the CUDA context, other processes)
    held before the engine loaded anything."""

    name: str
    total_bytes: int
    used_bytes: int
    capped: bool = False  # `memory.card_gib` under the card's own size: the process may use no more


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """What the card holds, and what follows: the pools in positions and how many replies of a length fit."""

    card: Card
    quantization: Literal["none", "fp8"]
    why: str  # the precision's reason, for the start-up log and /health
    weights_bytes: int
    reserve_bytes: int
    thinker_positions: int
    talker_rows: int
    thinker_position_bytes: int
    talker_row_bytes: int
    max_model_len: int
    max_frames: int
    max_batch: int
    code2wav_step_frames: int  # the widest step Code2Wav's graphs are made for (0: no Code2Wav)

    def replies(self, positions: int) -> int:
        """Replies of `positions` Thinker positions (a prompt and its reply) the pools hold at once, within the batch;
        0 past the context."""
        if positions > self.max_model_len:
            return 0
        talker_rows = positions + self.max_frames + TALKER_HEADER_ROWS
        return min(self.max_batch, self.thinker_positions // positions, self.talker_rows // talker_rows)

    def line(self) -> str:
        code2wav = (f", Code2Wav's steps {self.code2wav_step_frames} frames "
                    f"({self.code2wav_step_frames * CODE2WAV_FRAME_BYTES / GIB:.1f} GiB)" if self.code2wav_step_frames else "")
        return (f"{self.card.name}, {self.card.total_bytes / GIB:.1f} GiB{' (capped)' if self.card.capped else ''}: "
                f"weights {self.weights_bytes / GIB:.1f} GiB "
                f"({'FP8' if self.quantization == 'fp8' else 'bf16'} experts: {self.why}), held back "
                f"{self.reserve_bytes / GIB:.1f} GiB{code2wav}; KV pools: Thinker {self.thinker_positions:,} positions, Talker "
                f"{self.talker_rows:,} rows; replies at once of 2,048 positions {self.replies(2048)}, of 8,192 "
                f"{self.replies(8192)} (max_batch {self.max_batch})")


def choose_quantization(profile: DeployProfile, card: Card, params: dict[str, StageParams], thinker_position_bytes: int,
                        talker_row_bytes: int) -> tuple[Literal["none", "fp8"], str]:
    """The experts' precision: the profile's where it names one, else bf16 where `max_batch` replies of
    `typical_positions` fit beside bf16 weights, else FP8."""
    if profile.quantization != "auto":
        return profile.quantization, "as the profile sets"
    if profile.kernels != "triton":
        return "none", "FP8 experts need kernels: triton"
    mem, tk = profile.memory, profile.stages.thinker
    wanted = tk.max_batch * _reply_bytes(profile, mem.typical_positions, thinker_position_bytes, talker_row_bytes)
    room = _budget(profile, card) - _weights(params, fp8_experts=False) - _code2wav_bytes(profile, params)
    if room >= wanted:
        return "none", f"bf16 leaves {room / GIB:.1f} GiB, {tk.max_batch} replies of {mem.typical_positions:,} " \
                       f"positions take {wanted / GIB:.1f}"
    left = f"would leave {room / GIB:.1f} GiB" if room >= 0 else f"would not fit ({-room / GIB:.1f} GiB short)"
    return "fp8", f"bf16 {left}, {tk.max_batch} replies of {mem.typical_positions:,} positions take {wanted / GIB:.1f}"


def plan(profile: DeployProfile, card: Card, params: dict[str, StageParams], thinker_position_bytes: int,
         talker_row_bytes: int) -> MemoryPlan:
    """The plan, or an `EngineError` naming what does not fit. Explicit `kv_cache_tokens` are taken as they are."""
    quantization, why = choose_quantization(profile, card, params, thinker_position_bytes, talker_row_bytes)
    weights = _weights(params, fp8_experts=quantization == "fp8")
    tk, tl = profile.stages.thinker, profile.stages.talker
    room = _budget(profile, card) - weights
    one = _reply_bytes(profile, tk.max_model_len, thinker_position_bytes, talker_row_bytes)
    wanted = tk.max_batch * _reply_bytes(profile, profile.memory.typical_positions, thinker_position_bytes,
                                         talker_row_bytes)
    frames = _code2wav_frames(profile, params, room - wanted)
    left = room - frames * CODE2WAV_FRAME_BYTES
    if left < one:
        raise EngineError(_refusal(profile, card, weights, frames, left, one))
    # the pools in the proportion a reply of the whole context takes, rounded down to whole replies' worth of
    # positions where that matters little: the Thinker's in positions, the Talker's in rows
    talker_len = profile.stages.talker_max_len
    units = min(left / one, tk.max_batch)  # never more than every slot's whole length: no slot could use it
    thinker_positions = tk.kv_cache_tokens or int(units * tk.max_model_len)
    talker_rows = tl.kv_cache_tokens or int(units * talker_len) // tl.copies
    return MemoryPlan(card=card, quantization=quantization, why=why, weights_bytes=weights,
                      reserve_bytes=int(profile.memory.reserve_gib * GIB), thinker_positions=thinker_positions,
                      talker_rows=talker_rows, thinker_position_bytes=thinker_position_bytes,
                      talker_row_bytes=talker_row_bytes, max_model_len=tk.max_model_len, max_frames=tl.max_frames,
                      max_batch=tk.max_batch, code2wav_step_frames=frames)


def _weights(params: dict[str, StageParams], *, fp8_experts: bool) -> int:
    # the Talker's and Code2Wav's copies share their stage's weights
    return sum(p.bytes(fp8_experts and stage != "code2wav") for stage, p in params.items())


def _code2wav_bytes(profile: DeployProfile, params: dict[str, StageParams]) -> int:
    return profile.stages.code2wav.max_step_frames * CODE2WAV_FRAME_BYTES if "code2wav" in params else 0


def _code2wav_frames(profile: DeployProfile, params: dict[str, StageParams], spare: int) -> int:
    """Code2Wav's widest step: the profile's, or narrower where `spare` (what the weights, the reserve and the
    typical replies leave) cannot hold its graphs; four of the widest chunks at the least."""
    if "code2wav" not in params:
        return 0
    widest = profile.stages.code2wav.max_step_frames
    least = min(widest, 4 * max(profile.async_chunk.sizes()))
    return max(least, min(widest, spare // CODE2WAV_FRAME_BYTES))


def _budget(profile: DeployProfile, card: Card) -> int:
    """What weights and pools may take: the utilization's share of the card, less what others hold and the reserve."""
    mem = profile.memory
    return int(mem.gpu_memory_utilization * card.total_bytes) - card.used_bytes - int(mem.reserve_gib * GIB)


def _reply_bytes(profile: DeployProfile, positions: int, thinker_position_bytes: int, talker_row_bytes: int) -> int:
    """One reply of `positions` Thinker positions in both pools (its Talker rows across every Talker copy's)."""
    rows = positions + profile.stages.talker.max_frames + TALKER_HEADER_ROWS
    return positions * thinker_position_bytes + rows * talker_row_bytes


def _refusal(profile: DeployProfile, card: Card, weights: int, frames: int, left: int, one: int) -> str:
    tk = profile.stages.thinker
    fixes = [f"a smaller stages.thinker.max_model_len (now {tk.max_model_len:,})"] if left > 0 else []
    if profile.quantization == "none":
        fixes.append("quantization: fp8 (or auto)")
    fixes.append(f"a smaller memory.reserve_gib (now {profile.memory.reserve_gib:g}) or a higher "
                 f"memory.gpu_memory_utilization (now {profile.memory.gpu_memory_utilization:g})")
    return (f"the card does not fit this profile: {card.name} has {card.total_bytes / GIB:.1f} GiB "
            f"({card.used_bytes / GIB:.1f} held by others); the weights take {weights / GIB:.1f} GiB and "
            f"{profile.memory.reserve_gib:g} GiB is held back for graphs and activations"
            f"{f' and {frames * CODE2WAV_FRAME_BYTES / GIB:.1f} for Code2Wav steps of {frames} frames' if frames else ''}"
            f", which leaves "
            f"{left / GIB:.1f} GiB of the {profile.memory.gpu_memory_utilization:.0%} used, and one sequence of "
            f"{tk.max_model_len:,} positions needs {one / GIB:.2f} GiB ({(one - left) / GIB:.2f} GiB short). "
            f"What would fit: {'; '.join(fixes)}; or a card with more memory")


def count_params(source: ModelSource, stages: tuple[str, ...]) -> dict[str, StageParams]:
    """Each stage's parameters, its experts' apart, counted on the meta device (nothing is allocated)."""
    import torch

    params = {}
    for stage in stages:
        cls, config = stage_class(stage, source.config)  # type: ignore[arg-type]
        with torch.device("meta"):
            model = cls._from_config(config)
        experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
        params[stage] = StageParams(experts, sum(p.numel() for p in model.parameters()) - experts)
    return params


def card_of(device: str, card_gib: float = 0.0) -> Card:
    """The GPU `device` names, as the engine finds it before loading anything; `card_gib` under its size caps this
    process there (torch's per-process fraction), as if the card were that small."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    name, used = torch.cuda.get_device_name(device), total - free
    if not card_gib or card_gib * GIB >= total:
        return Card(name, total, used)
    index = torch.device(device).index
    torch.cuda.set_per_process_memory_fraction(card_gib * GIB / total, torch.cuda.current_device() if index is None else index)
    return Card(name, int(card_gib * GIB), used, capped=True)


def position_bytes(config: object, dtype_bytes: int = BF16_BYTES) -> int:
    """One position's keys and values over every layer of a decoder with `config`."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads  # type: ignore[attr-defined]
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * dtype_bytes  # type: ignore[attr-defined]
