"""`voice-gateway steps` on a GPU: the tiny Thinker's decode steps through its graphs (compiled layers, the Triton
kernels), every (rows, context) timed, the JSON and figure written."""

from __future__ import annotations

import json
from pathlib import Path

from voice_gateway.cli import main


def test_decode_steps_are_timed_through_their_graphs(cache_dir: Path, tmp_path: Path) -> None:
    assert main(["steps", "tiny", "--device", "cuda", "--rows", "1,8", "--contexts", "64,512", "--replays", "3",
                 "--cache-dir", str(cache_dir), "--out-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "steps.json").read_text())
    assert [(r["rows"], r["context"]) for r in report["rows"]] == [(1, 64), (1, 512), (8, 64), (8, 512)]
    assert all(r["step_ms"] > 0 for r in report["rows"]) and report["machine"]["gpu"]["name"]
    assert (tmp_path / "steps.png").stat().st_size > 0
