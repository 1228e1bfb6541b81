"""Deploy profiles: defaults, platform deltas, CLI overrides, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.profile import CONFIG_DIR, ProfileError, load_profile


def test_shipped_profiles_load_on_every_platform() -> None:
    for path in CONFIG_DIR.glob("*.yaml"):
        for platform in ("cpu", "cuda"):
            profile = load_profile(path, platform=platform)
            assert profile.name == path.stem


def test_platform_delta_is_merged() -> None:
    cpu = load_profile(CONFIG_DIR / "qwen3_omni_moe.yaml", platform="cpu")
    cuda = load_profile(CONFIG_DIR / "qwen3_omni_moe.yaml", platform="cuda")
    assert cpu.stages.thinker.device == "cpu" and cpu.stages.thinker.dtype == "float32"
    assert cuda.stages.thinker.device == "cuda" and cuda.stages.thinker.dtype == "bfloat16"


def test_gpu_profile_turns_on_what_the_h200_measurements_chose() -> None:
    cuda = load_profile(CONFIG_DIR / "qwen3_omni_moe.yaml", platform="cuda")
    assert cuda.cuda_graphs and cuda.kernels == "triton"
    assert cuda.first_packet.text_lead == 5
    assert cuda.engine.where == "process" and cuda.engine.http_workers == 4 and not cuda.runs_in_process
    assert [cuda.async_chunk.size(i) for i in range(9)] == [4, 4, 6, 8, 11, 15, 20, 25, 25]
    cpu = load_profile(CONFIG_DIR / "qwen3_omni_moe.yaml", platform="cpu")
    assert not cpu.cuda_graphs and cpu.kernels == "reference" and cpu.runs_in_process


def test_overrides_reach_any_key_after_the_platform_delta() -> None:
    profile = load_profile(CONFIG_DIR / "qwen3_omni_moe.yaml", platform="cuda",
                           overrides='{"cuda_graphs": false, "engine": {"where": "in_process"}, "stages": {"talker": {"max_batch": 8}}}')
    assert not profile.cuda_graphs and profile.engine.where == "in_process"
    assert profile.stages.talker.max_batch == 8 and profile.stages.thinker.max_batch == 64
    assert profile.kernels == "triton"  # the platform delta's other keys stay


def test_a_live_turn_waits_longer_for_a_place_than_a_request() -> None:
    default = load_profile(model="tiny", platform="cpu").admission
    assert (default.queue_timeout_s, default.live_queue_timeout_s) == (0.1, 5.0)
    profile = load_profile(model="tiny", platform="cpu", overrides='{"admission": {"live_queue_timeout_s": 2}}')
    assert profile.admission.live_queue_timeout_s == 2.0 and profile.admission.queue_timeout_s == 0.1
    with pytest.raises(ProfileError, match=r"admission\.live_queue_timeout_s: must be >= 0"):
        load_profile(model="tiny", platform="cpu", overrides={"admission": {"live_queue_timeout_s": -1}})


def test_graphs_need_cuda_devices() -> None:
    with pytest.raises(ProfileError, match="cuda_graphs: needs every stage on a CUDA device"):
        load_profile(model="tiny", platform="cpu", overrides={"cuda_graphs": True})


def test_stage_overrides_refine_one_key() -> None:
    profile = load_profile(model="tiny", platform="cpu", stage_overrides='{"talker": {"max_batch": 3}}')
    assert profile.stages.talker.max_batch == 3
    assert profile.stages.talker.max_frames == 48  # the rest of the tiny profile stays


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ('{"talker": {"max_btch": 3}}', "stages.talker.max_btch: unknown key"),
        ('{"talker": {"max_batch": 0}}', "stages.talker.max_batch: must be >= 1"),
        ('{"talker": {"max_batch": "8"}}', "stages.talker.max_batch: must be an integer"),
        ('{"code2wav": {"dtype": "int4"}}', "stages.code2wav.dtype: must be one of"),
        ('{"thinker": {"sampling": {"top_p": 1.5}}}', "stages.thinker.sampling.top_p: must be <= 1.0"),
        ('{"vocoder": {}}', "stages.vocoder: unknown key"),
        ('{"thinker": {"enforce_eager": false}}', "stages.thinker.enforce_eager: unknown key"),
        ('{"thinker": {"kv_cache_tokens": 100}}', "stages.thinker.kv_cache_tokens: must hold one sequence"),
        # the tiny profile's 1024 positions + 48 frames + 16
        ('{"talker": {"kv_cache_tokens": 1000}}', "stages.talker.kv_cache_tokens: must hold one reply of .*1088"),
        ('{"thinker": {"image_graph_sizes": ["1280x"]}}', "stages.thinker.image_graph_sizes: each is WIDTHxHEIGHT"),
        ('{"thinker": {"image_graph_sizes": "1280x720"}}', "stages.thinker.image_graph_sizes: must be a list"),
        ("{not json", "--stage-overrides: not valid JSON"),
        ("[1, 2]", "--stage-overrides: must be a mapping"),
    ],
)
def test_bad_overrides_name_the_key(overrides: str, message: str) -> None:
    with pytest.raises(ProfileError, match=message.replace("[", r"\[")):
        load_profile(model="tiny", platform="cpu", stage_overrides=overrides)


def test_stages_nearer_the_audio_get_the_higher_stream_priority() -> None:
    from engine.omni.stages.code2wav import Code2WavStage
    from engine.omni.stages.talker import TalkerStage
    from engine.omni.stages.thinker import ThinkerStage

    assert Code2WavStage.stream_priority < TalkerStage.stream_priority < ThinkerStage.stream_priority <= 0


def test_chunk_schedule_ramps_up_to_chunk_frames(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("async_chunk: {initial_chunk_frames: 4, ramp_frames: [8, 16], chunk_frames: 25}")
    chunks = load_profile(path, platform="cpu").async_chunk
    assert [chunks.size(i) for i in range(5)] == [4, 8, 16, 25, 25]
    assert chunks.sizes() == (4, 8, 16, 25)


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("async_chunk: {chunk_frames: -1}", "async_chunk.chunk_frames: must be >= 1"),
        ("async_chunk: {ramp_frames: 8}", "async_chunk.ramp_frames: must be a list"),
        ("async_chunk: {ramp_frames: [8, 0]}", r"async_chunk.ramp_frames\[1\]: must be >= 1"),
        ("platforms: {tpu: {}}", "platforms.tpu: unknown platform"),
        ("platforms: {cpu: {stages: {talker: {copies: 0}}}}", "stages.talker.copies: must be >= 1"),
        ("load_format: safetensors", "load_format: must be one of auto, dummy"),
        ("cuda_graphs: 1", "cuda_graphs: must be true or false"),
        ("kernels: cutlass", "kernels: must be one of reference, triton"),
        ("first_packet: {text_lead: -1}", "first_packet.text_lead: must be >= 0"),
        ("engine: {where: remote}", "engine.where: must be one of in_process, process, ray"),
        ("- a list", "top level must be a mapping"),
    ],
)
def test_bad_files_name_the_key(tmp_path: Path, yaml_text: str, message: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ProfileError, match=message):
        load_profile(path, platform="cpu")
