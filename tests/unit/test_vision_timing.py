"""`voice-gateway vision` (engine/probes/vision_timing.py) on the tiny model, on the CPU: both forms of the tower
timed for every count of pictures, each call's patches counted from the pictures' grids, the JSON and the figure
written, and bad counts refused."""

from __future__ import annotations

import json
from pathlib import Path

from voice_gateway.cli import main


def test_both_forms_are_timed_for_every_count(tiny_checkpoint: Path, cache_dir: Path, tmp_path: Path) -> None:
    assert main(["vision", "tiny", "--pictures", "1,3", "--replays", "1", "--cache-dir", str(cache_dir),
                 "--out-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "vision.json").read_text())
    assert [(r["form"], r["pictures"]) for r in report["rows"]] == [
        ("transformers", 1), ("transformers", 3), ("engine", 1), ("engine", 3)]
    assert all(r["call_ms"] > 0 for r in report["rows"])
    # a 1280x720 picture within the profile's 409,600 pixels is 832x480: 52 x 30 patches
    assert [r["patches"] for r in report["rows"]] == [1_560, 4_680] * 2
    assert report["command"].startswith("voice-gateway vision tiny") and report["machine"]["cpu_count"]
    assert (tmp_path / "vision.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_counts_are_refused(tmp_path: Path) -> None:
    assert main(["vision", "--pictures", "0", "--out-dir", str(tmp_path)]) == 1
    assert main(["vision", "--pictures", "some", "--out-dir", str(tmp_path)]) == 1
    assert main(["vision", "--replays", "0", "--out-dir", str(tmp_path)]) == 1
    assert not (tmp_path / "vision.json").exists()
