"""`voice-gateway kernels` on a GPU: every stage and count timed, the JSON and figure written."""

from __future__ import annotations

import json
from pathlib import Path

from voice_gateway.cli import main


def test_the_experts_are_timed(tmp_path: Path) -> None:
    assert main(["kernels", "--out-dir", str(tmp_path), "--tokens", "1,64", "--replays", "3"]) == 0
    report = json.loads((tmp_path / "experts.json").read_text())
    assert [(r["stage"], r["tokens"]) for r in report["rows"]] == [("thinker", 1), ("thinker", 64), ("talker", 1),
                                                                   ("talker", 64)]
    assert all(r["bf16_us"] > 0 and r["fp8_us"] > 0 and r["quantize_us"] > 0 for r in report["rows"])
    assert report["machine"]["gpu"]["name"] and report["git_commit"] and (tmp_path / "experts.png").stat().st_size > 0
