"""`voice-gateway bench --ladder` end to end: a real server per row (the transformers generate()
baseline and the Omni engine, tiny model on the CPU), JSON per row, ladder.json and figures;
a row whose server cannot start is recorded as failed and the ladder goes on. Rows given as whole
`serve:` commands run against any server; rows as profile deltas need `serve --overrides`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import REPO

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FRAMES = 12  # per reply: short, so both rows finish in seconds on two CPU cores
TEXT_TOKENS = 4


def _bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "voice_gateway.cli", "bench", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _tiny_profile(tmp_path: Path, name: str, **top: Any) -> Path:
    """configs/tiny.yaml with the benchmark workload (fixed reply lengths, EOS ignored) and `top` keys."""
    profile = yaml.safe_load((REPO / "configs/tiny.yaml").read_text())
    profile["stages"]["thinker"]["ignore_eos"] = True
    profile["stages"]["talker"].update(max_frames=FRAMES, ignore_eos=True)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**profile, **top}))
    return path


def _serve_has_overrides() -> bool:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    help_text = subprocess.run([sys.executable, "-m", "voice_gateway.cli", "serve", "--help"], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=120).stdout
    return re.search(r"(?<![\w-])--overrides\b", help_text) is not None


def test_ladder_runs_baseline_and_staged_rows(tiny_checkpoint: Path, cache_dir: Path, tmp_path: Path) -> None:
    baseline_profile = _tiny_profile(tmp_path, "baseline", backend="transformers_generate")
    staged_profile = _tiny_profile(tmp_path, "staged")
    ladder = tmp_path / "ladder.yaml"
    ladder.write_text(f"""
title: tiny CPU ladder (test)
bench: {{concurrency: [1, 2], num_requests: 2, warmup: 1, max_tokens: {TEXT_TOKENS}}}
rows:
  - name: baseline
    what: transformers generate(return_audio=True), one request at a time
    serve: [tiny, --deploy-config, "{baseline_profile}", --cache-dir, "{cache_dir}"]
  - name: staged
    what: the Omni engine, async chunked audio
    serve: [tiny, --deploy-config, "{staged_profile}", --cache-dir, "{cache_dir}"]
    bench: {{concurrency: [2]}}
""")
    out = tmp_path / "out"
    result = _bench("--ladder", str(ladder), "--out-dir", str(out), "--warmup", "0")
    assert result.returncode == 0, result.stdout + result.stderr

    data = json.loads((out / "ladder.json").read_text())
    assert data["title"] == "tiny CPU ladder (test)" and "--ladder" in data["command"]
    assert {"processor", "cpu_count", "python", "versions", "gpu"} <= data["machine"].keys()
    assert data["machine"]["versions"]["torch"] and data["machine"]["versions"]["transformers"]
    rows = data["rows"]
    assert [(r["name"], r["status"], r["error"]) for r in rows] == [("baseline", "ok", None), ("staged", "ok", None)]
    assert [[lv["concurrency"] for lv in r["levels"]] for r in rows] == [[1, 2], [2]]  # the row's bench wins
    for row in rows:
        assert "-m voice_gateway.cli serve tiny" in row["serve_command"] and row["startup_s"] > 0
        assert row["config"]["warmup"] == 0 and row["config"]["max_tokens"] == TEXT_TOKENS  # command line > file
        for lv in row["levels"]:
            assert lv["failures"] == 0 and lv["completed"] == 2 and lv["req_per_s"] > 0
            assert lv["ttfp_s"]["mean"] > 0 and lv["rtf"]["p99"] > 0 and lv["audio_s_mean"] > 0
            # the server's own TTFT/TTFP (its /metrics: the engine's from submit, the gateway's from
            # the request's arrival) come in that order, before the client sees them
            assert 0 < lv["server_ttft_mean_s"] <= lv["server_http_ttft_mean_s"] <= lv["ttft_s"]["mean"]
            assert 0 < lv["server_ttfp_mean_s"] <= lv["server_http_ttfp_mean_s"] <= lv["ttfp_s"]["mean"]
            # the staged engine says where its first packet went, part by part; generate() has no parts
            parts = lv["server_first_packet_parts_mean_s"]
            if row["name"] == "staged":
                assert set(parts) == {"queued", "thinker", "talker_prefill", "talker_frames", "code2wav"}
                assert sum(parts.values()) == pytest.approx(lv["server_ttfp_mean_s"], rel=1e-6)
            else:
                assert parts == {}
            assert lv["client_lag_ms"]["p99"] >= lv["client_lag_ms"]["mean"] >= -1  # sampled while it ran
            # the headers leave once the engine took the request, before its first text
            assert 0 < lv["headers_s"]["mean"] <= lv["ttft_s"]["mean"]
            # fixed length: max_tokens text tokens and the profile's codec frames, in both backends
            assert lv["audio_frames_mean"] == FRAMES and lv["completion_tokens_mean"] == TEXT_TOKENS + FRAMES
            # which stage held the machine: each stage's steps over the level, as the server counted them
            steps = lv["server_steps"]
            assert steps and all(s["steps"] > 0 and s["mean_ms"] > 0 and s["busy_share"] > 0 for s in steps.values())
    staged_stages = {key.split("/")[0] for key in rows[1]["levels"][0]["server_steps"]}
    assert {"thinker", "talker", "code2wav"} <= staged_stages, staged_stages

    baseline = json.loads((out / "baseline.json").read_text())
    staged = json.loads((out / "staged.json").read_text())
    assert baseline["row"]["what"].startswith("transformers generate") and baseline["label"] == "baseline"
    for record in baseline["levels"][0]["records"]:
        # nothing streams early: the whole reply's audio is one chunk, sent when generate() returns
        assert record["ok"] and record["chunk_gaps_ms"] == [] and record["audio_frames"] == FRAMES
        assert record["ttfp_s"] >= record["ttft_s"] > 0
    for record in staged["levels"][0]["records"]:
        assert record["ok"] and len(record["chunk_gaps_ms"]) >= 1  # audio streams in chunks
    assert (out / "logs" / "baseline.log").read_text()
    for name in data["plots"]:
        assert (out / name).read_bytes().startswith(PNG_MAGIC)
    assert len(data["plots"]) == 5


def test_a_row_that_cannot_start_is_recorded_and_the_ladder_goes_on(cache_dir: Path, tmp_path: Path) -> None:
    bad = _tiny_profile(tmp_path, "bad")
    profile = yaml.safe_load(bad.read_text())
    profile["stages"]["talker"]["max_batch"] = 0
    bad.write_text(yaml.safe_dump(profile))
    ladder = tmp_path / "ladder.yaml"
    ladder.write_text(f"""
rows:
  - name: bad-profile
    what: the server exits at once
    serve: [tiny, --deploy-config, "{bad}", --cache-dir, "{cache_dir}"]
  - name: too-slow
    what: the server does not answer /health in time
    serve: tiny --cache-dir {cache_dir}
    startup_timeout_s: 0.5
""")
    out = tmp_path / "out"
    result = _bench("--ladder", str(ladder), "--out-dir", str(out), "--concurrency", "1")
    assert result.returncode == 1, result.stdout + result.stderr
    rows = json.loads((out / "ladder.json").read_text())["rows"]
    assert [(r["name"], r["status"], r["levels"]) for r in rows] == [("bad-profile", "failed", []),
                                                                      ("too-slow", "failed", [])]
    assert "exited with code 2" in rows[0]["error"]
    assert "stages.talker.max_batch: must be >= 1" in rows[0]["error"]  # the server's log tail
    assert "no answer from" in rows[1]["error"] and "within 0.5 s" in rows[1]["error"]
    bad = json.loads((out / "bad-profile.json").read_text())
    assert bad["row"]["status"] == "failed" and bad["levels"] == [] and bad["config"]["concurrency"] == [1]
    assert (out / "at_max_concurrency.png").read_bytes().startswith(PNG_MAGIC)


@pytest.mark.skipif(not _serve_has_overrides(), reason="needs `voice-gateway serve --overrides`")
def test_ladder_rows_as_profile_deltas(tiny_checkpoint: Path, cache_dir: Path, tmp_path: Path) -> None:
    ladder = tmp_path / "ladder.yaml"
    ladder.write_text(f"""
base: configs/tiny.yaml
profile: {{stages: {{thinker: {{ignore_eos: true}}, talker: {{max_frames: {FRAMES}, ignore_eos: true}}}}}}
bench: {{concurrency: [1], num_requests: 1, warmup: 0, max_tokens: {TEXT_TOKENS}}}
rows:
  - name: baseline
    what: transformers generate(return_audio=True)
    profile: {{backend: transformers_generate}}
    serve: [--cache-dir, "{cache_dir}"]
  - name: staged
    what: the Omni engine as configs/tiny.yaml ships it
    serve: [--cache-dir, "{cache_dir}"]
""")
    out = tmp_path / "out"
    result = _bench("--ladder", str(ladder), "--out-dir", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((out / "ladder.json").read_text())
    assert data["base"] == "configs/tiny.yaml"
    for row in data["rows"]:
        assert "serve tiny --deploy-config configs/tiny.yaml --overrides" in row["serve_command"]
        assert row["profile"]["stages"]["talker"]["max_frames"] == FRAMES
        assert row["levels"][0]["audio_frames_mean"] == FRAMES and row["levels"][0]["failures"] == 0
    assert data["rows"][0]["profile"]["backend"] == "transformers_generate" and "backend" not in data["rows"][1]["profile"]
    baseline = json.loads((out / "baseline.json").read_text())
    assert baseline["git_commit"] and baseline["levels"][0]["records"][0]["chunk_gaps_ms"] == []  # one chunk


def _stopped_servers() -> set[int]:
    """Server processes (`voice_gateway.cli serve`) stopped by a signal now."""
    stopped = set()
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if stat.rpartition(")")[2].split()[0] == "T" and b"voice_gateway.cli\0serve" in command:
            stopped.add(int(entry.name))
    return stopped


@pytest.mark.skipif(not _serve_has_overrides(), reason="needs `voice-gateway serve --overrides`")
def test_held_servers_serve_every_round_and_wait_stopped_between(tiny_checkpoint: Path, cache_dir: Path,
                                                                 tmp_path: Path) -> None:
    """--held: one server per row for the whole run, warmed once, each paused while the other sweeps. An
    engine child paused with its server past its stall timeout is not taken for a stalled one."""
    ladder = tmp_path / "ladder.yaml"
    ladder.write_text(f"""
base: configs/tiny.yaml
profile: {{engine: {{supervision: {{stall_timeout_s: 1}}}}, stages: {{talker: {{max_frames: {FRAMES}, ignore_eos: true}}}}}}
bench: {{concurrency: [1], num_requests: 3, warmup: 0, max_tokens: {TEXT_TOKENS}}}
rows:
  - name: in-process
    what: the engine in the server's process
    serve: [--cache-dir, "{cache_dir}"]
  - name: engine-process
    what: the engine in a child process
    profile: {{engine: {{where: process}}}}
    serve: [--cache-dir, "{cache_dir}"]
""")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    stopped: set[int] = set()
    with (tmp_path / "bench.log").open("w+") as log, \
            subprocess.Popen([sys.executable, "-m", "voice_gateway.cli", "bench", "--ladder", str(ladder),
                              "--out-dir", str(out), "--repeats", "2", "--held"],
                             cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT) as bench:
        while bench.poll() is None:
            stopped |= _stopped_servers()
            time.sleep(0.2)
        log.seek(0)
        assert bench.returncode == 0, log.read()

    urls = {}
    for where in (out, out / "round-2"):
        for name in ("in-process", "engine-process"):
            row = json.loads((where / f"{name}.json").read_text())
            assert row["row"]["held"] is True and row["levels"][0]["completed"] == 3
            urls.setdefault(name, set()).add(row["config"]["url"])
    assert all(len(seen) == 1 for seen in urls.values()), urls  # one server a row, kept for both rounds
    assert len(stopped) >= 2, stopped  # each row's server waited stopped while the other swept
    assert json.loads((out / "ladder.json").read_text())["rounds"]["count"] == 2

    child_log = (out / "logs" / "engine-process.log").read_text()
    assert len(re.findall(r"engine process \d+ ready", child_log)) == 1 and "stalled" not in child_log
    for url in {u for seen in urls.values() for u in seen}:
        with pytest.raises(httpx.HTTPError):  # every server stopped at the end
            httpx.get(url + "/health", timeout=2)
