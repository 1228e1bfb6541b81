"""`voice-gateway bench --image`: the synthetic picture, the request bodies that carry it (chat `image_url` parts,
realtime `input_image` items), its flags and ladder setting, the image tokens recorded from usage, and runs
against loopback fakes and against a real tiny server."""

from __future__ import annotations

import argparse
import base64
import io
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from websockets.asyncio.server import ServerConnection, serve

import bench
from bench import BenchConfig, RequestRecord, StreamTimer, TurnRecord, TurnTimer, VoiceConfig
from bench.cli import config_from_args, voice_config_from_args
from bench.config import sweep_overrides
from bench.image import JPEG_QUALITY, MAX_FRAMES, check_image_spec, load_image, synthetic_picture
from bench.realtime_session import image_item, run_session
from bench.speech import Question
from bench.stats import summarize_level
from bench.sweep import read_image
from bench.voice import _Level
from bench.voice_stats import turn_stats
from tests.bench.fake_chat import FakeChat, fake_chat  # noqa: F401 (the fixture)
from tests.conftest import REPO, Server, start_server, stop_server

DATA_URL = "data:image/jpeg;base64,/9j/AA=="


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_bench_arguments(parser)
    return parser.parse_args(list(argv))


def _jpeg_of(data_url: str) -> Image.Image:
    head, _, b64 = data_url.partition(",")
    assert head == "data:image/jpeg;base64", head
    return Image.open(io.BytesIO(base64.b64decode(b64)))


# ----------------------------------------------------------------------------- the picture

def test_the_synthetic_picture_is_a_jpeg_of_its_size_and_the_same_every_time() -> None:
    frame = synthetic_picture(1280, 720)
    assert frame == synthetic_picture(1280, 720)
    img = Image.open(io.BytesIO(frame))
    assert (img.format, img.size, img.mode) == ("JPEG", (1280, 720), "RGB")
    img.load()  # decodes whole, not just its header
    # camera-like: gradients, objects and noise keep a 720p frame near a real one's size, not a flat few KiB
    assert 60_000 < len(frame) < 400_000, len(frame)
    thumb = np.asarray(img.resize((32, 18))).reshape(-1, 3)
    assert len(np.unique(thumb, axis=0)) > 200  # not a few flat colours
    small = synthetic_picture(64, 48)
    assert Image.open(io.BytesIO(small)).size == (64, 48) and small != synthetic_picture(48, 64)
    # the quality asked for: at 85 the luminance table's DC step is 16 * 30 % = 5
    assert JPEG_QUALITY == 85 and Image.open(io.BytesIO(frame)).quantization[0][0] == 5


def test_load_image_makes_the_data_url_once_and_says_what_it_sent(tmp_path: Path) -> None:
    synthetic = load_image("64x48")
    assert synthetic.info == bench.image.ImageInfo("64x48", 64, 48, "jpeg", len(synthetic_picture(64, 48)))
    (url,) = synthetic.data_urls
    assert _jpeg_of(url).size == (64, 48)
    assert base64.b64decode(url.partition(",")[2]) == synthetic_picture(64, 48)
    # frames of one room, each its own: the first is the picture, no two have the same pixels
    frames = load_image("64x48", 5)
    assert frames.info.distinct == 5 and frames.data_urls[0] == url
    pixels = [np.asarray(_jpeg_of(u), dtype=np.int16) for u in frames.data_urls]
    assert all(not np.array_equal(a, b) for i, a in enumerate(pixels) for b in pixels[i + 1:])
    assert max(float(np.abs(a - pixels[0]).mean()) for a in pixels) < 12  # the same scene: sensor noise apart
    assert len(load_image("8x8", MAX_FRAMES + 9).data_urls) == MAX_FRAMES

    png = tmp_path / "desk.png"
    Image.new("RGB", (40, 30), (200, 10, 10)).save(png)
    shown = load_image(str(png))
    assert shown.info == bench.image.ImageInfo(str(png), 40, 30, "png", png.stat().st_size)
    assert shown.data_urls == ("data:image/png;base64," + base64.b64encode(png.read_bytes()).decode(),)  # as it is
    assert load_image(str(png), 7).data_urls == shown.data_urls  # a file is one picture
    webp = tmp_path / "frame.webp"
    Image.new("RGB", (8, 8)).save(webp)
    assert load_image(str(webp)).data_urls[0].startswith("data:image/webp;base64,")
    assert read_image(None) is None
    with pytest.raises(bench.BenchError, match="--image 'gone.png': no such file"):
        read_image("gone.png")


@pytest.mark.parametrize(("spec", "message"), [
    ("12x", "'12x': a size is WIDTHxHEIGHT, e.g. 1280x720"),
    ("1280*720", "'1280*720': a size is WIDTHxHEIGHT"),
    ("0x720", "'0x720': width and height must be 1-4096 px"),
    ("5000x10", "'5000x10': width and height must be 1-4096 px"),
    ("missing.png", "'missing.png': no such file (expected a PNG, JPEG or WebP file, or WxH such as 1280x720)"),
])
def test_a_bad_image_flag_is_a_usage_error_that_says_why(spec: str, message: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        _parse("--image", spec)
    assert exit_.value.code == 2
    assert f"argument --image: {message}" in capsys.readouterr().err


def test_a_file_that_is_no_png_jpeg_or_webp_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gif, text = tmp_path / "a.gif", tmp_path / "notes.txt"
    Image.new("RGB", (4, 4)).save(gif)
    text.write_text("not a picture")
    with pytest.raises(SystemExit):
        _parse("--image", str(gif))
    assert "a GIF image; --image takes PNG, JPEG or WebP" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not an image Pillow reads"):
        check_image_spec(str(text))


# ----------------------------------------------------------------------------- flags and ladder files

def test_image_flags_make_chat_and_realtime_configs(tmp_path: Path) -> None:
    assert config_from_args(_parse("--image", "1280x720"), []).image == "1280x720"
    jpeg = tmp_path / "frame.jpg"
    jpeg.write_bytes(synthetic_picture(16, 16))
    assert config_from_args(_parse("--image", str(jpeg)), []).image == str(jpeg)
    assert config_from_args(_parse(), []).image is None
    realtime = voice_config_from_args(_parse("--realtime", "--image", "64x48", "--image-every", "3"), [])
    assert (realtime.image, realtime.image_every) == ("64x48", 3)
    assert voice_config_from_args(_parse("--realtime", "--image", "64x48"), []).image_every == 1
    with pytest.raises(bench.BenchError, match="image_every"):
        voice_config_from_args(_parse("--realtime", "--image-every", "2"), [])  # without a picture to send
    with pytest.raises(SystemExit):
        _parse("--realtime", "--image", "64x48", "--image-every", "0")
    argv = ["--image", "64x48", "--image-every", "2", "--out-dir", str(tmp_path)]
    assert bench.bench_main(_parse(*argv), argv) == 2  # --image-every is for conversations only
    assert list(tmp_path.iterdir()) == [jpeg]


def test_a_ladder_file_sets_the_image_like_any_sweep_setting(tmp_path: Path) -> None:
    assert sweep_overrides({"image": "640x480", "concurrency": 4}, "bench") == {"image": "640x480", "concurrency": [4]}
    with pytest.raises(bench.BenchError, match=r"rows\[0\]\.bench\.image: 'nope.jpg': no such file"):
        sweep_overrides({"image": "nope.jpg"}, "rows[0].bench")
    with pytest.raises(bench.BenchError, match=r"bench\.image: must be a PNG/JPEG/WebP path or WxH"):
        sweep_overrides({"image": 640}, "bench")
    ladder = tmp_path / "ladder.yaml"
    ladder.write_text("bench: {image: 32x32}\nrows:\n  - {name: a, what: x, serve: tiny, bench: {image: 64x48}}\n")
    loaded = bench.load_ladder(ladder)
    assert loaded.bench == {"image": "32x32"} and loaded.rows[0].bench == {"image": "64x48"}


# ----------------------------------------------------------------------------- request bodies

def test_a_chat_request_shows_the_picture_before_its_text() -> None:
    body = bench.build_payload(BenchConfig(), "m", 3, prompt_words=2, image_url=DATA_URL)
    assert body["messages"] == [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": DATA_URL}}, {"type": "text", "text": "#3 please"}]}]
    # with a spoken question too: the picture, the text, then the audio
    both = bench.build_payload(BenchConfig(), "m", 1, prompt_words=1, input_audio=["QQ==", "Qg=="], image_url=DATA_URL)
    assert [p["type"] for p in both["messages"][0]["content"]] == ["image_url", "text", "input_audio"]
    assert both["messages"][0]["content"][2]["input_audio"] == {"data": "Qg==", "format": "wav"}
    assert bench.build_payload(BenchConfig(), "m", 3, prompt_words=2)["messages"][0]["content"] == "#3 please"


def test_a_realtime_turn_shows_the_picture_as_a_ga_user_item() -> None:
    assert image_item(DATA_URL) == {"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_image", "image_url": DATA_URL}]}}


# ----------------------------------------------------------------------------- image tokens from usage

def test_image_tokens_are_recorded_from_usage_and_averaged() -> None:
    records = []
    for i, image_tokens in enumerate((24, 26)):
        rec = RequestRecord(index=i, concurrency=1)
        timer = StreamTimer(rec, 0.0)
        timer.on_data(json.dumps({"choices": [{"index": 0, "delta": {"content": "hi"}}]}), 0.1)
        timer.on_data(json.dumps({"choices": [], "usage": {
            "prompt_tokens": 40, "completion_tokens": 3,
            "prompt_tokens_details": {"audio_tokens": 0, "image_tokens": image_tokens}}}), 0.2)
        timer.on_data("[DONE]", 0.2)
        timer.finish(0.2)
        rec.ok = True
        records.append(rec)
    assert [r.image_tokens for r in records] == [24, 26]
    assert summarize_level(1, records, 1.0).image_tokens_mean == 25
    older = RequestRecord(index=0, concurrency=1, ok=True, prompt_tokens=9)  # a server without the detail
    assert summarize_level(1, [older], 1.0).image_tokens_mean is None

    turn = TurnRecord(session=0, turn=0, question="egg", speech_s=3.0, image=True)
    timer_rt = TurnTimer(turn, vad=False)
    timer_rt.input_ended(1.0)
    timer_rt.on_message(json.dumps({"type": "response.output_audio.delta", "delta": base64.b64encode(
        b"\0\0" * 480).decode()}), 1.2)
    timer_rt.on_message(json.dumps({"type": "response.done", "response": {"status": "completed", "usage": {
        "input_tokens": 90, "input_token_details": {"cached_tokens": 0, "image_tokens": 30}}}}), 1.3)
    timer_rt.finish()
    assert (turn.image_tokens, turn.cached_tokens, turn.ok) == (30, 0, True)
    assert turn_stats(None, [turn]).image_tokens_mean == 30


# ----------------------------------------------------------------------------- loopback fakes

@pytest.mark.parametrize("processes", [1, 2])
async def test_every_chat_request_carries_the_picture_and_the_json_says_which(
        fake_chat: tuple[str, type[FakeChat]], tmp_path: Path, processes: int) -> None:  # noqa: F811
    url, handler = fake_chat
    cfg = BenchConfig(url=url, concurrency=[2], num_requests=3, warmup=1, modalities=["text"], image="64x48",
                      client_processes=processes, label="img", out_dir=tmp_path, show_progress=False)
    await bench.run_bench(cfg)
    assert len(handler.requests) == 1 + 3  # the warm-up shows it too
    for body in handler.requests:
        first = body["messages"][0]["content"][0]
        assert first["type"] == "image_url" and _jpeg_of(first["image_url"]["url"]).size == (64, 48)
    # each its own picture, as each user's is: none a server has seen before
    assert len({b["messages"][0]["content"][0]["image_url"]["url"] for b in handler.requests}) == 4
    data = json.loads((tmp_path / "img.json").read_text())
    assert data["schema_version"] == 2 and data["config"]["image"] == "64x48"
    assert data["image"] == {"spec": "64x48", "width": 64, "height": 48, "format": "jpeg",
                             "size_bytes": len(synthetic_picture(64, 48)), "distinct": 4}
    level = data["levels"][0]
    assert level["image_tokens_mean"] == 24 and level["prompt_tokens_mean"] == 34
    assert [r["image_tokens"] for r in level["records"]] == [24, 24, 24]


async def test_a_chat_run_without_a_picture_records_none(fake_chat: tuple[str, type[FakeChat]],  # noqa: F811
                                                         tmp_path: Path) -> None:
    url, handler = fake_chat
    cfg = BenchConfig(url=url, concurrency=[1], num_requests=1, warmup=0, modalities=["text"], label="plain",
                      out_dir=tmp_path, show_progress=False)
    await bench.run_bench(cfg)
    assert isinstance(handler.requests[0]["messages"][0]["content"], str)
    data = json.loads((tmp_path / "plain.json").read_text())
    assert data["image"] is None and data["config"]["image"] is None and data["levels"][0]["image_tokens_mean"] == 0


Answer = Callable[[ServerConnection, dict[str, Any]], Awaitable[None]]


@asynccontextmanager
async def _fake_realtime(answer: Answer) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A realtime endpoint on loopback: session.created, session.updated for session.update, and `answer` for
    every other client event; yields its base URL and every client event received, in order."""
    received: list[dict[str, Any]] = []

    async def session(ws: ServerConnection) -> None:
        await ws.send(json.dumps({"type": "session.created", "session": {}}))
        async for raw in ws:
            received.append(event := json.loads(raw))
            if event["type"] == "session.update":
                await ws.send(json.dumps({"type": "session.updated", "session": {}}))
            else:
                await answer(ws, event)

    async with serve(session, "127.0.0.1", 0) as server:
        yield f"http://127.0.0.1:{next(iter(server.sockets)).getsockname()[1]}", received


async def test_each_turn_shows_its_picture_before_its_question() -> None:
    images = 0

    async def reply(ws: ServerConnection, event: dict[str, Any]) -> None:
        """A little audio and a response.done whose usage counts 30 tokens a picture the conversation holds."""
        nonlocal images
        if event["type"] == "conversation.item.create":
            images += sum(p["type"] == "input_image" for p in event["item"]["content"])
        elif event["type"] == "response.create":
            await ws.send(json.dumps({"type": "response.output_audio.delta",
                                      "delta": base64.b64encode(b"\0\0" * 480).decode()}))
            usage = {"input_tokens": 50 + 30 * images,
                     "input_token_details": {"cached_tokens": 0, "image_tokens": 30 * images}}
            await ws.send(json.dumps({"type": "response.done", "response": {"status": "completed", "usage": usage}}))

    question = Question("hum", b"", b"\0\0" * 1920)  # 80 ms: two appends of 40 ms
    async with _fake_realtime(reply) as (url, received):
        config = VoiceConfig(url=url, image="64x48", image_every=2, input_speed=20, timeout=10)
        records = await run_session(config, "m", "commit", "pcm16", [question], 0, 3, pictures=(DATA_URL, "x", DATA_URL))
    assert [r.error for r in records] == [None, None, None]
    kinds = [e["type"] for e in received]
    turn = ["input_audio_buffer.append", "input_audio_buffer.append", "input_audio_buffer.commit", "response.create"]
    # turns 0 and 2 of 3 carry it (t % 2 == 0), each as its first event
    assert kinds == ["session.update", "conversation.item.create", *turn, *turn, "conversation.item.create", *turn]
    assert [e for e in received if e["type"] == "conversation.item.create"] == [image_item(DATA_URL)] * 2
    assert [(r.image, r.image_tokens) for r in records] == [(True, 30), (False, 30), (True, 60)]


def test_each_turn_of_a_realtime_run_shows_a_picture_of_its_own() -> None:
    """Warm-up sessions (one turn each) and each session's turns, level after level: no picture twice until the
    run's pictures are used up."""
    urls = tuple(f"data:image/jpeg;base64,{i}" for i in range(2 * (2 + 4) * 3))  # what measure_voice draws
    config = VoiceConfig(warmup=2, turns=3)
    first = _Level(config, "m", "commit", "pcm16", (), urls, 0)
    second = _Level(config, "m", "commit", "pcm16", (), urls, (2 + 4) * 3)
    shown = [p for level in (first, second) for p in [*level.pictures(-2, 1), *level.pictures(-1, 1),
                                                      *(u for s in range(4) for u in level.pictures(s, 3))]]
    assert len(shown) == len(set(shown)) == 28
    assert _Level(config, "m", "commit", "pcm16", ()).pictures(0, 3) == ()


async def test_a_refused_picture_fails_its_turn() -> None:
    async def refuse(ws: ServerConnection, event: dict[str, Any]) -> None:
        if event["type"] == "conversation.item.create":
            await ws.send(json.dumps({"type": "error", "error": {"code": "invalid_image", "message": "no"}}))

    async with _fake_realtime(refuse) as (url, _):
        config = VoiceConfig(url=url, image="64x48", input_speed=20, timeout=10)
        records = await run_session(config, "m", "commit", "pcm16", [Question("q", b"", b"\0\0" * 960)], 0, 2,
                                    pictures=(DATA_URL,))
    assert len(records) == 1 and not records[0].ok
    assert records[0].error == "error event: invalid_image: no" and not records[0].refused


# ----------------------------------------------------------------------------- a real tiny server

@pytest.fixture(scope="module")
def tiny_server(tiny_checkpoint: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # 16 codec frames (1.28 s) a reply keep each turn short on the CPU
    proc, srv = start_server(cache_dir, tmp_path_factory.mktemp("image") / "server.log",
                             "--stage-overrides", '{"talker": {"max_frames": 16}}')
    yield srv
    stop_server(proc)


def _bench(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "voice_gateway.cli", "bench", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.integration
def test_chat_with_a_picture_against_the_tiny_server(tiny_server: Server, tmp_path: Path) -> None:
    result = _bench("--url", tiny_server.base_url, "--image", "64x48", "--prompt-tokens", "4", "--concurrency", "1",
                    "--num-requests", "2", "--warmup", "0", "--max-tokens", "8", "--label", "chat-image",
                    "--out-dir", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr + tiny_server.log()[-3000:]
    data = json.loads((tmp_path / "chat-image.json").read_text())
    assert data["image"]["width"] == 64 and data["image"]["format"] == "jpeg"
    level = data["levels"][0]
    assert level["failures"] == 0 and level["image_tokens_mean"] > 0
    assert all(0 < r["image_tokens"] < r["prompt_tokens"] for r in level["records"])
    assert "64x48 JPEG" in result.stdout
    # the server's /metrics: each request's picture went through the tower in a step of its own; the engine
    # runs in the server's process here, so nothing crossed to another
    assert level["server_vision_tower_calls"] == 2 and level["server_vision_tower_mean_s"] > 0
    assert level["server_crossing_mean_s"] is None
    assert 0 < level["server_image_decode_mean_s"] < 1  # each picture's decoding in the server
    printed = " ".join(result.stdout.split())  # the console wraps its lines
    assert "C=1 before the engine:" in printed and "then the vision tower 2 calls of" in printed


@pytest.mark.integration
def test_realtime_with_a_picture_each_turn_against_the_tiny_server(tiny_server: Server, tmp_path: Path) -> None:
    result = _bench("--realtime", "--url", tiny_server.base_url, "--image", "64x48", "--concurrency", "1",
                    "--turns", "2", "--max-tokens", "8", "--input-speed", "4", "--warmup", "0",
                    "--label", "voice-image", "--out-dir", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr + tiny_server.log()[-3000:]
    data = json.loads((tmp_path / "voice-image.json").read_text())
    assert data["image"]["size_bytes"] == len(synthetic_picture(64, 48))
    records = data["levels"][0]["records"]
    assert all(r["ok"] and r["image"] for r in records), records
    # the second turn's conversation holds both pictures
    assert 0 < records[0]["image_tokens"] < records[1]["image_tokens"], records
    assert data["levels"][0]["overall"]["image_tokens_mean"] > 0
    # each turn's new picture went through the tower (the first turn's, held in the conversation's prefix, not again)
    assert data["levels"][0]["server_vision_tower_calls"] == 2 and data["levels"][0]["server_vision_tower_mean_s"] > 0
    assert data["levels"][0]["server_image_decode_mean_s"] > 0
    assert re.search(r"C=1 before the engine: each picture decoded in [\d.]+ s; then the vision tower",
                     " ".join(result.stdout.split()))
