"""`voice-gateway kernels` (engine/probes/experts_timing.py, engine/probes/predictor_timing.py, engine/probes/attention_timing.py): where there is no CUDA GPU it
says so and fails, as it does for counts that are not counts; its figures are drawn from the JSON it writes
(tests/gpu times for real)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.plots import plot_attention_timing, plot_experts_timing, plot_predictor_timing
from engine.probes.attention_timing import AttentionTiming
from engine.probes.experts_timing import ExpertsTiming
from engine.probes.predictor_timing import PredictorTiming
from voice_gateway.cli import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is what a machine without CUDA gets")
def test_without_a_gpu_it_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["kernels", "--out-dir", str(tmp_path)]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "experts.json").exists()


def test_bad_counts_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["kernels", "--out-dir", str(tmp_path), "--tokens", "64,0"]) == 1
    assert main(["kernels", "--out-dir", str(tmp_path), "--tokens", "many"]) == 1
    assert main(["kernels", "--out-dir", str(tmp_path), "--replays", "0"]) == 1
    assert main(["kernels", "--out-dir", str(tmp_path), "--batches", "1,,64"]) == 1
    assert capsys.readouterr().err.count("voice-gateway kernels:") == 4


def test_the_figure_is_drawn_from_the_rows(tmp_path: Path) -> None:
    rows = [ExpertsTiming(stage, n, 10.0 * n, 7.0 * n, 2.0).as_dict() for stage in ("thinker", "talker")
            for n in (1, 64)]
    assert rows[0]["fp8_over_bf16"] == 0.7
    (tmp_path / "experts.json").write_text(json.dumps({"machine": {"gpu": {"name": "a GPU"}}, "rows": rows}))
    png = plot_experts_timing(tmp_path / "experts.json", tmp_path / "experts.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_predictor_figure_is_drawn_from_the_rows(tmp_path: Path) -> None:
    rows = [PredictorTiming(form, n, 0.1 * n, 1800 - 300 * (form == "kernel"), 1.0).as_dict()
            for form in ("torch", "kernel") for n in (1, 64, 128)]
    (tmp_path / "predictor.json").write_text(json.dumps({"machine": {"gpu": {"name": "a GPU"}}, "rows": rows}))
    png = plot_predictor_timing(tmp_path / "predictor.json", tmp_path / "predictor.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_attention_figure_is_drawn_from_the_rows(tmp_path: Path) -> None:
    rows = [AttentionTiming(b, n, s, n / s / 10, 1000.0).as_dict() for b in (1, 64) for n in (512, 8192) for s in (1, 4)]
    (tmp_path / "attention.json").write_text(json.dumps({"machine": {"gpu": {"name": "a GPU"}}, "rows": rows}))
    png = plot_attention_timing(tmp_path / "attention.json", tmp_path / "attention.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
