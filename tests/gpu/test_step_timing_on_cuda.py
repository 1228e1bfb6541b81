"""`voice-gateway steps` on a GPU: the tiny Thinker's steps through its graphs (compiled layers, the Triton
kernels), decode rows alone and beside prompt pieces, every (rows, context, prompt) timed, the JSON and figure
written."""

from __future__ import annotations

import json
from pathlib import Path

from voice_gateway.cli import main


def test_decode_steps_are_timed_through_their_graphs(cache_dir: Path, tmp_path: Path) -> None:
    assert main(["steps", "tiny", "--device", "cuda", "--rows", "1,8", "--contexts", "64,512", "--prompts", "0,256",
                 "--replays", "3", "--cache-dir", str(cache_dir), "--out-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "steps.json").read_text())
    cells = [(1, 64), (1, 512), (8, 64), (8, 512)]
    assert [(r["rows"], r["context"], r["prompt"]) for r in report["rows"]] == [(*c, p) for p in (0, 256) for c in cells]
    assert all(r["step_ms"] > 0 for r in report["rows"]) and report["machine"]["gpu"]["name"]
    assert (tmp_path / "steps.png").stat().st_size > 0
