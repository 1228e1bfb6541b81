"""The command line: a missing checkpoint fails at once; the bench drives a live server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, Server


def test_serve_without_the_checkpoint_fails_at_once(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "voice_gateway.cli", "serve", str(tmp_path / "no-such-model"), "--cache-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert "looked in" in result.stderr and "no-such-model" in result.stderr


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
