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


def test_gpu_profile_is_the_ladder_rung_it_names() -> None:
    """configs/qwen3_omni_moe.yaml on CUDA switches on what H200 ladder rung 33 served."""
    shipped = load_profile(CONFIG_DIR / "qwen3_omni_moe.yaml", platform="cuda")
    measured = load_profile(CONFIG_DIR.parent / "benchmarks/h200/dummy-code2wav-defers.yaml", model="dummy")
    switches = ("enforce_eager", "moe_implementation", "decode_attention", "graph_prefill", "graph_prefill_groups",
                "fine_prefill_buckets", "compile_decode")
    for stage in ("thinker", "talker"):
        for key in switches:
            assert getattr(getattr(shipped.stages, stage), key) == getattr(getattr(measured.stages, stage), key), key
    assert shipped.stages.thinker.pace_text_lead == measured.stages.thinker.pace_text_lead == 5
    assert shipped.stages.talker.code_predictor == measured.stages.talker.code_predictor
    assert shipped.stages.own_cuda_streams == measured.stages.own_cuda_streams
    assert shipped.async_chunk == measured.async_chunk
    assert shipped.stages.code2wav.fused_snake == measured.stages.code2wav.fused_snake
    assert shipped.stages.thinker.first_chunk_priority and measured.stages.thinker.first_chunk_priority
    assert shipped.stages.code2wav.defer_ahead_s == measured.stages.code2wav.defer_ahead_s == 1.0
    assert shipped.engine_process == measured.engine_process
    cpu = load_profile(CONFIG_DIR / "qwen3_omni_moe.yaml", platform="cpu")
    assert not cpu.engine_process and cpu.http_workers == 1
    # the row ran its server with --http-workers 4
    ladder = (CONFIG_DIR.parent / "benchmarks/h200/ladder.yaml").read_text()
    row = ladder[ladder.index("- name: code2wav-defers"):]
    assert "dummy-code2wav-defers.yaml --http-workers 4" in row.splitlines()[2]
    assert shipped.http_workers == 4


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
        ('{"code2wav": {"stream_priority": -4}}', "stages.code2wav.stream_priority: must be >= -3"),
        ('{"thinker": {"stream_priority": 1}}', "stages.thinker.stream_priority: must be <= 0"),
        ("{not json", "--stage-overrides: not valid JSON"),
        ("[1, 2]", "--stage-overrides: must be a mapping"),
    ],
)
def test_bad_overrides_name_the_key(overrides: str, message: str) -> None:
    with pytest.raises(ProfileError, match=message.replace("[", r"\[")):
        load_profile(model="tiny", platform="cpu", stage_overrides=overrides)


def test_stages_nearer_the_audio_get_the_higher_stream_priority_unless_told() -> None:
    stages = load_profile(model="tiny", platform="cpu").stages
    assert stages.code2wav.stream_priority < stages.talker.stream_priority < stages.thinker.stream_priority
    told = load_profile(model="tiny", platform="cpu", stage_overrides={"code2wav": {"stream_priority": 0}})
    assert told.stages.code2wav.stream_priority == 0


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
        ("platforms: {cpu: {stages: {talker: {replicas: 0}}}}", "stages.talker.replicas: must be >= 1"),
        ("load_format: safetensors", "load_format: must be one of auto, dummy"),
        ("stages: {thinker: {enforce_eager: 1}}", "stages.thinker.enforce_eager: must be true or false"),
        ("- a list", "top level must be a mapping"),
    ],
)
def test_bad_files_name_the_key(tmp_path: Path, yaml_text: str, message: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ProfileError, match=message):
        load_profile(path, platform="cpu")
