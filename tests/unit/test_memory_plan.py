"""The memory plan's arithmetic (engine/omni/memory.py) for the released model's weights on the cards people rent,
and for the tiny model: the experts' precision `auto` picks, the KV pools, the replies that fit, the refusal of a
card too small and explicit keys winning. The weights are counted on the meta device, as start-up counts them."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import EngineError, load_profile
from engine.core import Pools
from engine.handoff import AdmittedRequest
from engine.omni.memory import (
    CODE2WAV_FRAME_BYTES,
    GIB,
    TALKER_HEADER_ROWS,
    Card,
    MemoryPlan,
    StageParams,
    count_params,
    plan,
    position_bytes,
)
from engine.omni.runners.kv_cache import PAGE_SIZE
from engine.omni.weights.source import ModelSource

CONTEXT = int(0.5 * GIB)  # what the CUDA context holds before the engine loads anything
H100 = Card("NVIDIA H100 80GB HBM3", int(79.19 * GIB), CONTEXT)
H200 = Card("NVIDIA H200", int(139.8 * GIB), CONTEXT)
L40S = Card("NVIDIA L40S", int(44.4 * GIB), CONTEXT)
A6000 = Card("NVIDIA RTX A6000", 48 * GIB, CONTEXT)


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, StageParams], int, int]:
    source = ModelSource.open("dummy", "dummy", tmp_path_factory.mktemp("dummy"))
    params = count_params(source, ("thinker", "talker", "code2wav"))
    c = source.config
    return params, position_bytes(c.thinker_config.text_config), position_bytes(c.talker_config.text_config)


def _gpu_profile(**overrides: object):
    return load_profile(model="dummy", platform="cuda", overrides={"load_format": "dummy", **overrides})


def test_the_released_model_weighs_what_its_config_says(released) -> None:
    params, thinker_position, talker_row = released
    assert 28.9e9 < params["thinker"].experts < 29.1e9 and 3.0e9 < params["talker"].experts < 3.1e9
    assert params["code2wav"].experts == 0
    assert thinker_position == 96 * 1024 and talker_row == 20 * 1024  # keys and values of every layer, bf16


def test_an_80_gb_card_takes_fp8_experts_and_holds_64_replies(released) -> None:
    params, thinker_position, talker_row = released
    profile = _gpu_profile()
    p = plan(profile, H100, params, thinker_position, talker_row)
    assert p.quantization == "fp8" and "bf16 would not fit" in p.why
    # what is left of 90 % after the context, the reserve, Code2Wav's widest step as the profile has it and the FP8
    # weights goes to the pools, split by a reply
    assert p.code2wav_step_frames == profile.stages.code2wav.max_step_frames == 800
    held = 4 * GIB + 800 * CODE2WAV_FRAME_BYTES
    left = int(0.9 * H100.total_bytes) - CONTEXT - held - p.weights_bytes
    tk, talker_len = profile.stages.thinker, profile.stages.talker_max_len
    one = tk.max_model_len * thinker_position + talker_len * talker_row
    assert p.thinker_positions == int(left / one * tk.max_model_len)
    assert p.talker_rows == int(left / one * talker_len)
    used = p.weights_bytes + p.thinker_positions * thinker_position + p.talker_rows * talker_row
    assert used <= 0.9 * H100.total_bytes - CONTEXT - held
    assert 35 * GIB < p.weights_bytes < 37 * GIB
    assert p.replies(2048) == 64 and 16 < p.replies(8192) < 64
    assert "NVIDIA H100 80GB HBM3" in p.line() and "FP8 experts" in p.line()


def test_an_h200_keeps_bf16_experts(released) -> None:
    params, thinker_position, talker_row = released
    p = plan(_gpu_profile(), H200, params, thinker_position, talker_row)
    assert p.quantization == "none" and "bf16 leaves" in p.why
    assert 65 * GIB < p.weights_bytes < 67 * GIB
    assert p.replies(2048) == 64 and p.replies(8192) >= 48
    assert "bf16 experts" in p.line()


def test_a_48_gb_card_narrows_code2wav_and_serves_short_replies(released) -> None:
    params, thinker_position, talker_row = released
    profile = _gpu_profile()
    p = plan(profile, A6000, params, thinker_position, talker_row)
    assert p.quantization == "fp8"
    # no room for 64 typical replies: Code2Wav's graphs shrink to four of its widest chunks first
    assert p.code2wav_step_frames == 4 * profile.async_chunk.chunk_frames
    assert p.replies(profile.stages.thinker.max_model_len) >= 1 and p.replies(2048) < 16
    # the bench's replies (a short prompt, 40 tokens, 10 s of speech) fit 32 at once by their room in the pools
    pools = _pools(p)
    request = AdmittedRequest(request_id="r", token_ids=[0] * 60, audio_features=[], audio_tokens=0, audio_keys=[],
                              want_audio=True, speaker="ethan", max_tokens=40, temperature=0.7, top_p=0.8, top_k=20,
                              seed=None)
    bench = plan(_gpu_profile(stages={"talker": {"max_frames": 125}}), A6000, params, thinker_position, talker_row)
    positions, rows = _pools(bench).room(request)
    assert min(bench.thinker_positions // positions, bench.talker_rows // rows) >= 32
    assert pools.room(request) == (256, 1280)  # whole pages: the prompt and reply, the prompt's rows and 1,040 more
    assert "(capped)" not in p.line() and "Code2Wav's steps 100 frames" in p.line()


def _pools(p: MemoryPlan) -> Pools:
    """As assemble.py makes them from the runners' caches, which take the plan's pools in whole pages."""
    return Pools(-(-p.thinker_positions // PAGE_SIZE) * PAGE_SIZE, -(-p.talker_rows // PAGE_SIZE) * PAGE_SIZE,
                 p.max_frames + TALKER_HEADER_ROWS, PAGE_SIZE, p.max_model_len, p.max_model_len + p.max_frames + 16)


def test_a_card_too_small_is_refused_with_what_would_make_it_fit(released) -> None:
    params, thinker_position, talker_row = released
    with pytest.raises(EngineError, match=r"^the card does not fit this profile: NVIDIA L40S has 44\.4 GiB") as refused:
        plan(_gpu_profile(), L40S, params, thinker_position, talker_row)
    message = str(refused.value)
    assert "GiB short" in message and "memory.reserve_gib" in message and "a card with more memory" in message
    # bf16 named explicitly on an 80 GB card: the weights alone do not leave room for one sequence
    with pytest.raises(EngineError, match="quantization: fp8 \\(or auto\\)"):
        plan(_gpu_profile(quantization="none"), H100, params, thinker_position, talker_row)


def test_explicit_keys_win(released) -> None:
    params, thinker_position, talker_row = released
    p = plan(_gpu_profile(quantization="fp8", stages={"thinker": {"kv_cache_tokens": 100_000},
                                                      "talker": {"kv_cache_tokens": 50_000}}),
             H200, params, thinker_position, talker_row)
    assert p.quantization == "fp8" and p.why == "as the profile sets"
    assert (p.thinker_positions, p.talker_rows) == (100_000, 50_000)
    less = plan(_gpu_profile(memory={"gpu_memory_utilization": 0.6}), H200, params, thinker_position, talker_row)
    more = plan(_gpu_profile(), H200, params, thinker_position, talker_row)
    assert less.thinker_positions < more.thinker_positions


def test_the_tiny_model_plans_too(tiny_checkpoint: Path, cache_dir: Path) -> None:
    source = ModelSource.open("tiny", cache_dir=cache_dir)
    params = count_params(source, ("thinker", "talker", "code2wav"))
    c = source.config
    profile = load_profile(model="tiny", platform="cpu")
    p = plan(profile, Card("a small card", 16 * GIB, 0), params, position_bytes(c.thinker_config.text_config),
             position_bytes(c.talker_config.text_config))
    tk = profile.stages.thinker
    assert p.quantization == "none" and p.weights_bytes < GIB
    assert p.replies(tk.max_model_len) == tk.max_batch and p.replies(tk.max_model_len + 1) == 0
    # a small model on a big card: the pools stop at every slot's whole length, the old default
    assert (p.thinker_positions, p.talker_rows) == (tk.max_batch * tk.max_model_len,
                                                    tk.max_batch * profile.stages.talker_max_len)


def test_a_capped_card_is_planned_at_its_cap(released) -> None:
    """`memory.card_gib` (a card shared with other work, or a smaller card tried on a bigger one) is a profile key
    like any other, and a card of its size plans as that card does."""
    params, thinker_position, talker_row = released
    profile = _gpu_profile(memory={"card_gib": 48})
    assert profile.memory.card_gib == 48 and _gpu_profile().memory.card_gib == 0
    capped = Card("NVIDIA H100 80GB HBM3", 48 * GIB, CONTEXT, capped=True)
    p = plan(profile, capped, params, thinker_position, talker_row)
    assert p.thinker_positions == plan(profile, A6000, params, thinker_position, talker_row).thinker_positions
    assert "48.0 GiB (capped)" in p.line()
