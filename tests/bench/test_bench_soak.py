"""`voice-gateway bench soak` against a live tiny server: every kind of request succeeds, the server's memory
and open files are sampled through the run, and the JSON and the figure are written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, Server


def test_a_short_soak_writes_its_samples(server: Server, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "voice_gateway.cli", "bench", "soak", "--url", server.base_url, "--pid",
         str(server.pid), "--requests", "18", "--concurrency", "3", "--max-tokens", "2", "--sample-every", "0.2",
         "--settle", "0.5", "--label", "short", "--out-dir", str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "short.json").read_text())
    summary = report["summary"]
    assert summary["requests"] == 18 and summary["failed"] == 0, summary
    assert len(summary["by_kind"]) >= 4
    assert report["server"]["pid"] == server.pid and report["machine"]["cpu_count"]
    phases = [s["phase"] for s in report["samples"]]
    assert phases[0] == "before" and phases[-1] == "settled" and phases.count("traffic") >= 2
    assert all(s["rss_mib"] > 0 and s["fds"] > 0 for s in report["samples"])
    assert summary["fds"]["end"] <= summary["fds"]["start"] + 2, summary["fds"]
    assert report["health"]["after"]["active_requests"] == 0
    assert (tmp_path / "short.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
