"""`voice-gateway accuracy` (engine/probes/accuracy.py) on the tiny model: bf16 and FP8 against float32, the report's
numbers where they can only be (rounding, not a broken variant), and the JSON a benchmark keeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.probes.accuracy import compare
from voice_gateway.cli import main


def test_compare_reads_agreement() -> None:
    ref = torch.tensor([[3.0, 2.0, 1.0, 0.0] * 3, [0.0, 1.0, 2.0, 3.0] * 3])
    same = compare(ref, ref, ref, ref)
    assert same.logits_rel_error == 0 and same.top1_agreement == 1 and same.top10_overlap == 1
    flipped = compare(ref.flip(0), ref, ref, ref)
    assert flipped.top1_agreement == 0 and flipped.logits_rel_error > 0.5 and flipped.hidden_rel_error == 0


def test_the_report_on_the_tiny_model(tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "accuracy.json"
    assert main(["accuracy", "--steps", "24", "--out", str(out), "--cache-dir", str(tiny_checkpoint.parent)]) == 0
    report = json.loads(out.read_text())
    assert report["steps"] == 24 and report["experts_kernel"] == "dequantized"
    assert report["command"].startswith("voice-gateway accuracy") and report["machine"]["torch"]
    for stage in ("thinker", "talker"):
        for variant in ("bf16", "fp8"):
            a = report[stage][variant]
            # bf16 rounding moves the tiny model's rows by ~0.5 %; a lost scale or a wrong block would be ~100 %
            assert 1e-4 < a["logits_rel_error"] < 0.05 and 1e-4 < a["hidden_rel_error"] < 0.05, (stage, variant, a)
            assert a["top1_agreement"] >= 0.8 and a["top10_overlap"] >= 0.8
    assert report["thinker"]["fp8"]["positions"] == 24
    assert "thinker  fp8" in capsys.readouterr().out
