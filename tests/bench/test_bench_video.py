"""`voice-gateway bench --video`: the synthetic clip, the chat request bodies that carry it (`video_url` parts,
after the picture and before the text), its flag and ladder setting, the run's JSON, and a run against a real
tiny server whose usage counts the clip's frames as image tokens."""

from __future__ import annotations

import argparse
import base64
import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

import bench
from bench import BenchConfig
from bench.cli import config_from_args, voice_config_from_args
from bench.config import sweep_overrides
from bench.image import synthetic_picture
from bench.sweep import read_video
from bench.video import FRAME_RATE, VideoInfo, check_video_spec, load_video, synthetic_clip
from tests.bench.fake_chat import FakeChat, fake_chat  # noqa: F401 (the fixture)
from tests.conftest import REPO, Server, start_server, stop_server
from voice_gateway.media.videos import VideoLimits, decode_video

IMAGE_URL = "data:image/jpeg;base64,/9j/AA=="
VIDEO_URL = "data:video/mp4;base64,AAAAIGZ0eXA="


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_bench_arguments(parser)
    return parser.parse_args(list(argv))


def _decoded(raw: bytes) -> tuple[str, str, float, list[np.ndarray]]:
    """(container format, codec, seconds from the header, every frame as [H, W, 3] uint8)."""
    with av.open(io.BytesIO(raw)) as container:
        stream = container.streams.video[0]
        assert container.duration is not None and stream.average_rate == Fraction(FRAME_RATE), stream.average_rate
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
        return container.format.name, stream.codec_context.name, container.duration / av.time_base, frames


def _encoded(path: Path, fmt: str, codec: str, frames: int = 10) -> Path:
    with av.open(str(path), "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=10)
        stream.width, stream.height, stream.pix_fmt = 32, 24, "yuv420p"
        for k in range(frames):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.full((24, 32, 3), 20 * k, np.uint8))))
        container.mux(stream.encode())
    return path


# ----------------------------------------------------------------------------- the clip

def test_the_synthetic_clip_decodes_to_its_size_frames_and_length() -> None:
    raw = synthetic_clip(64, 48, 2)
    fmt, codec, seconds, frames = _decoded(raw)
    assert "mp4" in fmt.split(",") and codec == "h264" and seconds == 2.0
    assert len(frames) == 2 * FRAME_RATE == 20 and {f.shape for f in frames} == {(48, 64, 3)}
    # the shapes move: no two frames a tenth of a second apart are the same picture
    assert all(np.abs(a.astype(int) - b).mean() > 1 for a, b in zip(frames, frames[1:], strict=False))
    wide = _decoded(synthetic_clip(640, 360, 4))
    assert wide[2] == 4.0 and len(wide[3]) == 40 and wide[3][0].shape == (360, 640, 3)
    # the server samples it two frames a second
    assert decode_video(raw, VideoLimits()).frames.shape == (4, 48, 64, 3)


def test_the_synthetic_clip_is_the_same_bytes_for_the_same_spec() -> None:
    first = synthetic_clip(94, 50, 2)
    synthetic_clip.cache_clear()  # encoded again, not remembered, and after other sizes
    others = {synthetic_clip(1080, 1920, 1), synthetic_clip(48, 64, 2), synthetic_clip(94, 50, 3)}
    synthetic_clip.cache_clear()
    assert synthetic_clip(94, 50, 2) == first and first not in others and len(others) == 3
    # and in a process that has encoded nothing before
    fresh = subprocess.run([sys.executable, "-c", "import sys; from bench.video import synthetic_clip; "
                            "sys.stdout.buffer.write(synthetic_clip(94, 50, 2))"], cwd=REPO, capture_output=True,
                           timeout=120, check=True)
    assert fresh.stdout == first


def test_load_video_makes_the_data_url_once_and_says_what_it_sent(tmp_path: Path) -> None:
    synthetic = load_video("64x48x2")
    assert synthetic.info == VideoInfo("64x48x2", 64, 48, 2.0, "mp4", len(synthetic_clip(64, 48, 2)))
    head, _, b64 = synthetic.data_url.partition(",")
    assert head == "data:video/mp4;base64" and base64.b64decode(b64) == synthetic_clip(64, 48, 2)

    mp4 = _encoded(tmp_path / "walk.mp4", "mp4", "h264")
    shown = load_video(str(mp4))
    assert shown.info == VideoInfo(str(mp4), 32, 24, 1.0, "mp4", mp4.stat().st_size)
    assert shown.data_url == "data:video/mp4;base64," + base64.b64encode(mp4.read_bytes()).decode()  # as it is
    webm = _encoded(tmp_path / "Walk.WEBM", "webm", "libvpx-vp9")
    assert load_video(str(webm)).data_url.startswith("data:video/webm;base64,")
    assert load_video(str(webm)).info.format == "webm"
    assert read_video(None) is None
    with pytest.raises(bench.BenchError, match="--video 'gone.mp4': no such file"):
        read_video("gone.mp4")


# ----------------------------------------------------------------------------- the flag

@pytest.mark.parametrize(("spec", "message"), [
    ("640x360", "'640x360': a synthetic clip is WIDTHxHEIGHTxSECONDS, e.g. 640x360x4"),
    ("640x360x1.5", "'640x360x1.5': a synthetic clip is WIDTHxHEIGHTxSECONDS"),
    ("63x48x2", "'63x48x2': width and height must be even and at least 2 (H.264 4:2:0 halves both)"),
    ("0x48x2", "'0x48x2': width and height must be even and at least 2"),
    ("1920x1082x2", "'1920x1082x2': at most 1920x1080 = 2073600 pixels a frame"),
    ("64x48x0", "'64x48x0': 1-30 seconds"),
    ("64x48x31", "'64x48x31': 1-30 seconds"),
    ("missing.mp4", "'missing.mp4': no such file (expected an MP4 or WebM file, or WxHxS such as 640x360x4)"),
])
def test_a_bad_video_flag_is_a_usage_error_that_says_why(spec: str, message: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        _parse("--video", spec)
    assert exit_.value.code == 2
    assert f"argument --video: {message}" in capsys.readouterr().err


def test_a_file_that_is_no_mp4_or_webm_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mov = _encoded(tmp_path / "clip.mov", "mov", "h264")
    with pytest.raises(SystemExit) as exit_:
        _parse("--video", str(mov))
    assert exit_.value.code == 2
    assert f"argument --video: {mov}: --video takes an .mp4 or .webm file, not .mov" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not one without a suffix"):
        check_video_spec(str(_encoded(tmp_path / "clip", "mp4", "h264")))
    text = tmp_path / "notes.mp4"
    text.write_text("not a video")
    with pytest.raises(ValueError, match="notes.mp4: not a video PyAV reads"):
        check_video_spec(str(text))
    webm_named_mp4 = _encoded(tmp_path / "really-webm.mp4", "webm", "libvpx-vp9")
    with pytest.raises(ValueError, match="really-webm.mp4: holds matroska,webm, not mp4"):
        check_video_spec(str(webm_named_mp4))


def test_video_is_for_chat_sweeps_and_realtime_refuses_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert config_from_args(_parse("--video", "640x360x4"), []).video == "640x360x4"
    assert config_from_args(_parse(), []).video is None
    both = config_from_args(_parse("--image", "64x48", "--video", "64x48x2"), [])
    assert (both.image, both.video) == ("64x48", "64x48x2")
    with pytest.raises(bench.BenchError, match="^--realtime does not take --video$"):
        voice_config_from_args(_parse("--realtime", "--video", "64x48x2"), [])
    argv = ["--realtime", "--video", "64x48x2", "--url", "http://127.0.0.1:9", "--out-dir", str(tmp_path)]
    with caplog.at_level(logging.ERROR, logger="bench.cli"):
        assert bench.bench_main(_parse(*argv), argv) == 2
    assert "--realtime does not take --video" in caplog.text
    assert list(tmp_path.iterdir()) == []


def test_a_ladder_file_sets_the_video_like_any_sweep_setting(tmp_path: Path) -> None:
    assert sweep_overrides({"video": "640x360x4", "image": "64x48"}, "bench") == {"video": "640x360x4",
                                                                                  "image": "64x48"}
    with pytest.raises(bench.BenchError, match=r"rows\[0\]\.bench\.video: 'nope.webm': no such file"):
        sweep_overrides({"video": "nope.webm"}, "rows[0].bench")
    with pytest.raises(bench.BenchError, match=r"bench\.video: must be an MP4/WebM path or WxHxS"):
        sweep_overrides({"video": 640}, "bench")
    ladder = tmp_path / "ladder.yaml"
    ladder.write_text("bench: {video: 32x32x1}\nrows:\n  - {name: a, what: x, serve: tiny, bench: {video: 64x48x2}}\n")
    loaded = bench.load_ladder(ladder)
    assert loaded.bench == {"video": "32x32x1"} and loaded.rows[0].bench == {"video": "64x48x2"}


# ----------------------------------------------------------------------------- request bodies

def test_a_chat_request_shows_the_clip_before_its_text_and_after_the_picture() -> None:
    alone = bench.build_payload(BenchConfig(), "m", 3, prompt_words=2, video_url=VIDEO_URL)
    assert alone["messages"] == [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": VIDEO_URL}}, {"type": "text", "text": "#3 please"}]}]
    both = bench.build_payload(BenchConfig(), "m", 1, prompt_words=1, input_audio=["QQ=="], image_url=IMAGE_URL,
                               video_url=VIDEO_URL)
    content = both["messages"][0]["content"]
    assert [p["type"] for p in content] == ["image_url", "video_url", "text", "input_audio"]
    assert content[0]["image_url"] == {"url": IMAGE_URL} and content[1]["video_url"] == {"url": VIDEO_URL}


# ----------------------------------------------------------------------------- a run against a loopback fake

@pytest.mark.parametrize("processes", [1, 2])
async def test_every_chat_request_carries_the_clip_and_the_json_says_which(
        fake_chat: tuple[str, type[FakeChat]], tmp_path: Path, processes: int) -> None:  # noqa: F811
    url, handler = fake_chat
    cfg = BenchConfig(url=url, concurrency=[2], num_requests=3, warmup=1, modalities=["text"], image="64x48",
                      video="64x48x2", client_processes=processes, label="clip", out_dir=tmp_path,
                      show_progress=False)
    await bench.run_bench(cfg)
    assert len(handler.requests) == 1 + 3  # the warm-up shows it too
    clips = {body["messages"][0]["content"][1]["video_url"]["url"] for body in handler.requests}
    assert clips == {load_video("64x48x2").data_url}
    data = json.loads((tmp_path / "clip.json").read_text())
    assert data["config"]["video"] == "64x48x2" and data["image"]["spec"] == "64x48"
    assert data["video"] == {"spec": "64x48x2", "width": 64, "height": 48, "seconds": 2.0, "format": "mp4",
                             "size_bytes": len(synthetic_clip(64, 48, 2))}
    level = data["levels"][0]
    assert level["image_tokens_mean"] == 24 + 96 and [r["image_tokens"] for r in level["records"]] == [120] * 3


async def test_a_chat_run_without_a_clip_records_none(fake_chat: tuple[str, type[FakeChat]], tmp_path: Path) -> None:  # noqa: F811
    url, handler = fake_chat
    cfg = BenchConfig(url=url, concurrency=[1], num_requests=1, warmup=0, modalities=["text"], image="16x16",
                      label="picture", out_dir=tmp_path, show_progress=False)
    await bench.run_bench(cfg)
    assert [p["type"] for p in handler.requests[0]["messages"][0]["content"]] == ["image_url", "text"]
    data = json.loads((tmp_path / "picture.json").read_text())
    assert data["video"] is None and data["config"]["video"] is None
    assert data["image"]["size_bytes"] == len(synthetic_picture(16, 16))


# ----------------------------------------------------------------------------- a real tiny server

@pytest.fixture(scope="module")
def tiny_server(tiny_checkpoint: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # 16 codec frames (1.28 s) a reply keep each request short on the CPU
    proc, srv = start_server(cache_dir, tmp_path_factory.mktemp("video") / "server.log",
                             "--stage-overrides", '{"talker": {"max_frames": 16}}')
    yield srv
    stop_server(proc)


@pytest.mark.integration
def test_chat_with_a_clip_against_the_tiny_server(tiny_server: Server, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "voice_gateway.cli", "bench", "--url", tiny_server.base_url, "--video", "64x48x2",
         "--prompt-tokens", "4", "--concurrency", "1", "--num-requests", "2", "--warmup", "0", "--max-tokens", "8",
         "--label", "chat-video", "--out-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr + tiny_server.log()[-3000:]
    data = json.loads((tmp_path / "chat-video.json").read_text())
    assert data["video"]["seconds"] == 2.0 and data["video"]["format"] == "mp4" and data["image"] is None
    level = data["levels"][0]
    assert level["failures"] == 0 and level["image_tokens_mean"] > 0
    assert all(0 < r["image_tokens"] < r["prompt_tokens"] for r in level["records"]), level["records"]
    assert "64x48 MP4 of 2 s" in result.stdout
