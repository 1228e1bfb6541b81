"""Ladder files, sweep-setting precedence, --replot and the ladder's figures, without servers
(tests/integration/test_bench_ladder.py runs ladders against real servers)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

import bench
from bench import BenchConfig, BenchError, load_ladder
from bench.config import with_overrides
from bench.ladder import replot_ladder

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _ladder(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ladder.yaml"
    path.write_text(text)
    return path


def test_shipped_ladders_parse() -> None:
    h200 = load_ladder(REPO / "benchmarks/h200/ladder.yaml")
    assert [r.name for r in h200.rows] == ["baseline", "eager", "sampler-moe-grouped", "graphed-predictor",
                                          "graphed-decode", "batched-prefill", "batched-talker-prefill",
                                          "streaming-code2wav", "fused-moe", "decode-attention", "code2wav-buckets",
                                          "stage-streams", "graphed-code2wav", "compiled-predictor",
                                          "graphed-prefill", "chunk-ramp", "replicas", "prefill-groups",
                                          "compiled-decode", "gpu-profile", "text-pacing", "fine-prefill", "http-stack",
                                          "first-chunk-2", "unpaced", "gil-switch", "talker-prompt-host", "code2wav-yields",
                                          "burst-kernels", "engine-process",
                                          "parent-admission", "http-workers", "first-chunk-priority",
                                          "code2wav-defers"]
    assert h200.bench["concurrency"] == [1, 16, 32, 64] and h200.bench["max_tokens"] == 40
    for row in h200.rows:  # every profile a row names exists, and the baseline is the generate() backend
        config = Path(row.serve[row.serve.index("--deploy-config") + 1])
        assert (REPO / config).is_file(), config
    assert h200.rows[0].serve == ["dummy", "--deploy-config", "benchmarks/h200/generate-baseline.yaml",
                                  "--http", "h11", "--loop", "asyncio"]
    cpu = load_ladder(REPO / "benchmarks/cpu-tiny/ladder.yaml")
    assert len(cpu.rows) == 3 and "generate-baseline" in cpu.rows[0].serve[-1]


@pytest.mark.parametrize(("text", "message"), [
    ("rows: []\n", "rows: must be a non-empty list"),
    ("rows:\n  - {name: a, what: x}\n", r"rows\[0\].serve: missing"),
    ("rows:\n  - {name: a b, what: x, serve: tiny}\n", r"rows\[0\].name: must be letters"),
    ("rows:\n  - {name: ladder, what: x, serve: tiny}\n", r"rows\[0\].name: must be"),
    ("rows:\n  - {name: a, what: x, serve: tiny --port 1}\n", r"rows\[0\].serve: --port is set by the ladder"),
    ("rows:\n  - {name: a, what: x, serve: tiny, colour: red}\n", r"rows\[0\].colour: unknown key"),
    ("rows:\n  - {name: a, what: x, serve: tiny}\n  - {name: a, what: y, serve: tiny}\n", "'a' appears more"),
    ("rows:\n  - {name: a, what: x, serve: tiny, bench: {concurrency: [0]}}\n", r"rows\[0\].bench.concurrency"),
    ("bench: {speed: 3}\nrows:\n  - {name: a, what: x, serve: tiny}\n", "bench.speed: unknown key"),
    ("rows:\n  - {name: a, what: x, serve: tiny, startup_timeout_s: -1}\n", "startup_timeout_s: must be a positive number"),
    ("rowz: 1\n", "rowz: unknown key"),
])
def test_bad_ladder_files_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(BenchError, match=message):
        load_ladder(_ladder(tmp_path, text))


def test_sweep_settings_precedence(tmp_path: Path) -> None:
    ladder = load_ladder(_ladder(tmp_path, """
bench: {concurrency: [1, 16], max_tokens: 40, prompt_tokens: 128}
rows:
  - {name: a, what: x, serve: tiny}
  - {name: b, what: y, serve: [tiny, --deploy-config, c.yaml], bench: {concurrency: 2, num_requests: 3}}
"""))
    parser = argparse.ArgumentParser()
    bench.add_bench_arguments(parser)
    args = parser.parse_args(["--ladder", "x.yaml", "--max-tokens", "8", "--warmup", "0"])
    cli = bench.cli.cli_sweep(args)
    assert cli == {"max_tokens": 8, "warmup": 0}  # flags not given stay unset
    sweep = with_overrides(BenchConfig(), ladder.bench, cli)
    assert (sweep.concurrency, sweep.prompt_tokens, sweep.max_tokens, sweep.warmup) == ([1, 16], [128], 8, 0)
    row_b = with_overrides(sweep, ladder.rows[1].bench)
    assert (row_b.concurrency, row_b.num_requests, row_b.max_tokens) == ([2], 3, 8)
    assert ladder.rows[1].serve == ["tiny", "--deploy-config", "c.yaml"]


def _level(c: int, p: int, rps: float, ttfp: float | None) -> dict:
    stat = {"mean": ttfp, "p50": ttfp, "p99": None if ttfp is None else ttfp * 1.5}
    return {"concurrency": c, "prompt_words": p, "req_per_s": rps, "ttfp_s": stat, "rtf": stat, "failures": 0,
            "records": [{"index": 0}]}


def test_replot_rebuilds_ladder_json_and_figures_from_row_files(tmp_path: Path) -> None:
    ladder = load_ladder(_ladder(tmp_path, """
title: replot
rows:
  - {name: slow, what: baseline, serve: tiny}
  - {name: fast, what: + everything, serve: tiny}
  - {name: never, what: not run yet, serve: tiny}
"""))
    for name, levels in (("slow", [_level(1, 16, 0.1, 20.0), _level(4, 16, 0.1, 60.0)]),
                         ("fast", [_level(c, p, c * 0.5, 0.2 * c) for p in (16, 128) for c in (1, 16, 64)])):
        payload = {"label": name, "created": "t", "command": "voice-gateway bench", "config": {},
                   "machine": {"gpu": {"name": "NVIDIA H200"}}, "levels": levels,
                   "row": {"name": name, "what": "w", "serve_command": "s", "status": "ok", "error": None,
                           "startup_s": 1.0}}
        (tmp_path / f"{name}.json").write_text(json.dumps(payload))
    rows = replot_ladder(ladder, tmp_path, "voice-gateway bench --ladder x --replot")
    assert [(r["name"], r["status"]) for r in rows] == [("slow", "ok"), ("fast", "ok"), ("never", "missing")]
    data = json.loads((tmp_path / "ladder.json").read_text())
    assert data["machine"]["gpu"]["name"] == "NVIDIA H200" and data["command"].endswith("--replot")
    assert "records" not in data["rows"][0]["levels"][0]  # the per-request records stay in <row>.json
    assert data["plots"] == ["req_per_s.png", "ttfp_mean.png", "rtf_mean.png", "ttfp_p99.png",
                             "at_max_concurrency.png"]
    for name in data["plots"]:
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC)
