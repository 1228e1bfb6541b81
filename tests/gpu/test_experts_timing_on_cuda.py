"""`voice-gateway kernels` on a GPU: every stage, count and predictor form timed, the JSONs and figures written."""

from __future__ import annotations

import json
from pathlib import Path

from voice_gateway.cli import main


def test_the_experts_are_timed(tmp_path: Path) -> None:
    assert main(["kernels", "--out-dir", str(tmp_path), "--tokens", "1,64", "--batches", "1,8", "--replays", "3"]) == 0
    report = json.loads((tmp_path / "experts.json").read_text())
    assert [(r["stage"], r["tokens"]) for r in report["rows"]] == [("thinker", 1), ("thinker", 64), ("talker", 1),
                                                                   ("talker", 64)]
    assert all(r["bf16_us"] > 0 and r["fp8_us"] > 0 and r["quantize_us"] > 0 for r in report["rows"])
    assert report["machine"]["gpu"]["name"] and report["git_commit"] and (tmp_path / "experts.png").stat().st_size > 0
    frames = json.loads((tmp_path / "predictor.json").read_text())["rows"]
    assert [(r["attention"], r["batch"]) for r in frames] == [("torch", 1), ("torch", 8), ("kernel", 1), ("kernel", 8)]
    assert all(r["frame_ms"] > 0 and r["kernels"] > 0 for r in frames)
    assert all(r["codes_equal_torch"] == 1.0 for r in frames if r["attention"] == "torch")
    assert (tmp_path / "predictor.png").stat().st_size > 0
