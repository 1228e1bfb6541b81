"""`voice-gateway bench --realtime` and the chat sweep's --input-audio against a live tiny server on loopback:
its replies are noise, but sessions, turns, VAD, Opus packets and the measurements are real."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, Server, start_server, stop_server


@pytest.fixture(scope="module")
def short_replies(tiny_checkpoint: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # 16 codec frames (1.28 s) a reply keep each turn short on the CPU
    proc, srv = start_server(cache_dir, tmp_path_factory.mktemp("short") / "server.log",
                             "--stage-overrides", '{"talker": {"max_frames": 16}}')
    yield srv
    stop_server(proc)


def _bench(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "voice_gateway.cli", "bench", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=600)


def test_two_conversations_of_two_turns_in_each_mode_and_format(short_replies: Server, tmp_path: Path) -> None:
    result = _bench("--realtime", "--url", short_replies.base_url, "--concurrency", "2", "--turns", "2",
                    "--turn-mode", "commit,vad", "--output-format", "pcm16,opus", "--max-tokens", "8",
                    "--input-speed", "4", "--warmup", "0", "--label", "voice", "--out-dir", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "voice.json").read_text())
    assert report["benchmark"] == "realtime" and report["schema_version"] == 1
    assert report["command"].startswith("voice-gateway bench --realtime")
    assert set(report["questions"]) == {"book", "egg", "sunset", "weather"}
    levels = {(lv["mode"], lv["output_format"]): lv for lv in report["levels"]}
    assert set(levels) == {("commit", "pcm16"), ("commit", "opus"), ("vad", "pcm16"), ("vad", "opus")}
    for (mode, fmt), lv in levels.items():
        assert lv["concurrency"] == 2 and lv["sessions"] == 2
        records = lv["records"]
        assert [(r["session"], r["turn"]) for r in records] == [(0, 0), (0, 1), (1, 0), (1, 1)]
        assert all(r["ok"] and r["error"] is None and r["status"] == "completed" for r in records), records
        assert all(0 < r["first_audio_s"] <= r["done_s"] and r["audio_s"] > 0 for r in records), records
        assert all(r["offset_errors"] == 0 for r in records)
        if fmt == "opus":
            assert all(r["pieces"] == round(r["audio_s"] / 0.02) for r in records)  # one packet per 20 ms
        # each session's second turn carries its first in the history
        assert all(b["input_tokens"] > a["input_tokens"] for a, b in zip(records[::2], records[1::2], strict=True))
        # server VAD: the silence window, waited on top (0.5 s of silence sent at 4x real time, plus a chunk;
        # how long that takes here is the machine's business, not the test's)
        assert all((r["vad_wait_s"] is not None) == (mode == "vad") for r in records)
        assert all(r["vad_wait_s"] > 0.05 for r in records if mode == "vad")
        assert [t["turn"] for t in lv["by_turn"]] == [0, 1]
        # per turn, the mean share of each prompt that a cached prefix held (a first turn's prompt is too
        # short for the cache to keep, so the second prefills too: tests/unit/test_long_call.py sees reuse)
        for t, stats in enumerate(lv["by_turn"]):
            shares = [r["cached_tokens"] / r["input_tokens"] for r in records if r["turn"] == t]
            assert stats["cached_share_mean"] == pytest.approx(sum(shares) / len(shares))
        for stats in [lv["overall"], *lv["by_turn"]]:
            assert stats["failures"] == 0 and stats["first_audio_s"]["p99"] > 0
        # the engine's own first packet of every turn (our response.timing), within the client's first audio
        assert all(0 < r["engine_first_packet_s"] < r["first_audio_s"] + (r["vad_wait_s"] or 0) for r in records)
        assert (lv["server_turn_latency_mean_s"] is not None) == (mode == "vad")
        assert {"thinker", "talker", "code2wav"} <= {key.split("/")[0] for key in lv["server_steps"]}
        # the server's /metrics read while the level ran: every turn ended in one of its windows
        windows = lv["timeline"]
        assert sum(w["turns"] for w in windows) == len(records) and windows[0]["start_s"] == 0
        assert all(a["end_s"] == b["start_s"] for a, b in zip(windows, windows[1:], strict=False))
        stepped = {key.split("/")[0] for w in windows for key in w["steps"]}
        assert {"thinker", "talker", "code2wav"} <= stepped
        assert any(w["engine_ttfp_mean_s"] for w in windows)
        for w in windows:  # where each window's first packets went adds up to their mean
            if w["engine_first_packet_parts_mean_s"]:
                assert sum(w["engine_first_packet_parts_mean_s"].values()) == pytest.approx(w["engine_ttfp_mean_s"])
    assert (tmp_path / "voice.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "bench --realtime voice (tiny)" in result.stdout and "vad opus C=2: " in result.stdout
    assert "vad opus C=2 steps: " in result.stdout and " ms x " in result.stdout  # each stage's share, busiest first


@pytest.mark.parametrize("mode", ["commit", "server"])
def test_each_turn_splits_the_engines_first_packet_by_part(short_replies: Server, tmp_path: Path, mode: str) -> None:
    """Every completed turn carries the engine's own first packet and its parts (our `response.timing`), whether
    the client committed the turn or the server's own turn detection ended it; they add up, per turn and as the
    means of each turn index."""
    result = _bench("--realtime", "--url", short_replies.base_url, "--concurrency", "1", "--turns", "3",
                    "--turn-mode", mode, "--output-format", "pcm16", "--max-tokens", "8", "--input-speed", "4",
                    "--warmup", "0", "--label", "parts", "--out-dir", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    [lv] = json.loads((tmp_path / "parts.json").read_text())["levels"]
    records = lv["records"]
    assert [r["turn"] for r in records] == [0, 1, 2] and all(r["ok"] for r in records), records
    parts = ("queued", "thinker", "talker_prefill", "talker_frames", "code2wav")
    for r in records:
        assert tuple(r["first_packet_parts_s"]) == parts, r
        assert all(s >= 0 for s in r["first_packet_parts_s"].values()), r
        assert sum(r["first_packet_parts_s"].values()) == pytest.approx(r["engine_first_packet_s"], abs=0.003), r
    for t in lv["by_turn"]:
        [r] = [r for r in records if r["turn"] == t["turn"]]
        assert t["engine_first_packet_s"]["mean"] == pytest.approx(r["engine_first_packet_s"])
        assert t["engine_first_packet_parts_mean_s"] == pytest.approx(r["first_packet_parts_s"])
    overall = lv["overall"]
    assert sum(overall["engine_first_packet_parts_mean_s"].values()) == pytest.approx(
        overall["engine_first_packet_s"]["mean"], abs=0.003)
    assert f"{mode} pcm16 C=1 engine first packet by part, turn 1 -> 3: queued " in result.stdout
    assert (tmp_path / "parts.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_chat_with_input_audio_sends_the_questions(short_replies: Server, tmp_path: Path) -> None:
    result = _bench("--url", short_replies.base_url, "--input-audio", str(REPO / "benchmarks" / "voice"),
                    "--prompt-tokens", "1", "--concurrency", "2", "--num-requests", "2", "--warmup", "0",
                    "--max-tokens", "8", "--label", "chat-audio", "--out-dir", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    level = json.loads((tmp_path / "chat-audio.json").read_text())["levels"][0]
    assert level["failures"] == 0 and level["ttfp_s"]["mean"] > 0
    # "#<index>" alone is about 10 tokens; each 3 s question adds its audio's
    assert all(r["prompt_tokens"] > 30 for r in level["records"])
    assert "P=1 C=2 steps: " in result.stdout and "thinker/" in result.stdout


def test_a_time_limit_ends_the_level_and_keeps_what_was_done(short_replies: Server, tmp_path: Path) -> None:
    """Two conversations of 40 turns with a 5 s limit: the turns under way end, none starts after, and the result
    is written, with the turns not started counted."""
    result = _bench("--realtime", "--url", short_replies.base_url, "--concurrency", "2", "--turns", "40",
                    "--turn-mode", "commit", "--output-format", "pcm16", "--max-tokens", "8", "--input-speed", "8",
                    "--warmup", "0", "--time-limit", "5", "--label", "limited", "--out-dir", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    (lv,) = json.loads((tmp_path / "limited.json").read_text())["levels"]
    done = lv["overall"]["completed"]
    assert done >= 2 and lv["overall"]["failures"] == 0
    assert lv["turns_not_started"] > 0 and done + lv["turns_not_started"] == 2 * 40
    assert "stopped at the time limit" in result.stdout
