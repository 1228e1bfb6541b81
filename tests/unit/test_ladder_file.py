"""Ladder files, sweep-setting precedence, --replot and the ladder's figures, without servers
(tests/bench/test_bench_ladder.py runs ladders against real servers)."""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import pytest

import bench
from bench import BenchConfig, BenchError, load_ladder
from bench.config import with_overrides
from bench.ladder import replot_ladder, row_summary, write_ladder
from bench.rounds import round_order, summarize_rounds
from bench.server import ServerProcess
from engine.profile import load_profile

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _ladder(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ladder.yaml"
    path.write_text(text)
    return path


def test_shipped_ladders_parse() -> None:
    h200 = load_ladder(REPO / "benchmarks/h200/ladder.yaml")
    assert [r.name for r in h200.rows] == ["baseline", "eager", "triton-kernels", "cuda-graphs", "first-packet",
                                          "engine-process", "gpu-profile", "fp8-experts", "batch-128", "bf16-128"]
    assert (h200.model, h200.base) == ("dummy", Path("configs/qwen3_omni_moe.yaml"))
    assert (REPO / h200.base).is_file()
    assert h200.profile["load_format"] == "dummy" and h200.profile["stages"]["talker"]["max_frames"] == 125
    assert h200.bench == {"concurrency": [1, 16, 32, 64], "prompt_tokens": [32], "max_tokens": 40, "warmup": 2,
                          "timeout": 60.0, "client_processes": 4}
    assert h200.rows[0].profile["backend"] == "transformers_generate" and h200.rows[0].bench["concurrency"] == [1]
    # each row from eager on turns one switch back on; gpu-profile is the profile as shipped, and the rows after
    # it are choices over it
    deltas = [h200.row_profile(r) for r in h200.rows]
    changed = [sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)) for a, b in itertools.pairwise(deltas[1:])]
    assert changed[:4] == [["kernels"], ["cuda_graphs"], ["async_chunk", "first_packet"], ["engine"]]
    assert h200.rows[6].profile == {} and deltas[6] == h200.profile
    assert changed[5:] == [["quantization"], ["stages"], ["quantization", "stages"]]
    for row in h200.rows:
        args = h200.serve_args(row)
        assert args[:3] == ["dummy", "--deploy-config", "configs/qwen3_omni_moe.yaml"] and args[3] == "--overrides"
        assert json.loads(args[4]) == h200.row_profile(row)
        load_profile(REPO / h200.base, model="dummy", platform="cuda", overrides=h200.row_profile(row))  # valid

    ray = load_ladder(REPO / "benchmarks/cpu-tiny/ray/ladder.yaml")
    assert [r.name for r in ray.rows] == ["in-process", "engine-process", "ray-one-replica"]
    assert (REPO / ray.base).is_file()
    assert ray.serve_args(ray.rows[0]) == ["tiny", "--deploy-config", "configs/tiny.yaml"]  # nothing to override
    assert json.loads(ray.serve_args(ray.rows[1])[4]) == {"engine": {"where": "process"}}
    assert json.loads(ray.serve_args(ray.rows[2])[4]) == {"engine": {"where": "ray", "replicas": {"count": 1, "cpus": 2}}}


@pytest.mark.parametrize(("path", "platform"), [("benchmarks/h200/ladder.yaml", "cuda"),
                                              ("benchmarks/cpu-tiny/ray/ladder.yaml", "cpu")])
def test_every_shipped_row_is_a_profile_the_server_takes(path: str, platform: str) -> None:
    from engine.profile import load_profile  # the server's own check, which bench/ does not import

    ladder = load_ladder(REPO / path)
    assert ladder.base is not None
    for row in ladder.rows:
        load_profile(REPO / ladder.base, model=ladder.model, platform=platform, overrides=ladder.row_profile(row))


def test_rows_are_deltas_over_the_base(tmp_path: Path) -> None:
    ladder = load_ladder(_ladder(tmp_path, """
model: dummy
base: configs/qwen3_omni_moe.yaml
profile: {load_format: dummy, stages: {talker: {max_frames: 125, ignore_eos: true}}}
rows:
  - name: a
    what: x
    profile: {cuda_graphs: false, stages: {talker: {max_batch: 8}, code2wav: {copies: 2}}}
    serve: --http-workers 2 --log-level warning
  - {name: b, what: y}
"""))
    a, b = ladder.rows
    assert ladder.row_profile(a) == {"load_format": "dummy", "cuda_graphs": False, "stages": {
        "talker": {"max_frames": 125, "ignore_eos": True, "max_batch": 8}, "code2wav": {"copies": 2}}}
    assert ladder.profile["stages"]["talker"] == {"max_frames": 125, "ignore_eos": True}  # not merged in place
    args = ladder.serve_args(a)
    assert args[:4] == ["dummy", "--deploy-config", "configs/qwen3_omni_moe.yaml", "--overrides"]
    assert json.loads(args[4]) == ladder.row_profile(a) and args[5:] == ["--http-workers", "2", "--log-level", "warning"]
    assert json.loads(ladder.serve_args(b)[4]) == ladder.profile and ladder.serve_args(b)[5:] == []
    # the command the row's server runs, as DIR/<row>.json records it
    command = ServerProcess(ladder.serve_args(a), tmp_path / "a.log").command
    assert "-m voice_gateway.cli serve dummy --deploy-config configs/qwen3_omni_moe.yaml --overrides '{" in command


def test_rows_without_a_base_give_their_whole_serve_command(tmp_path: Path) -> None:
    ladder = load_ladder(_ladder(tmp_path, "rows:\n  - {name: a, what: x, serve: tiny --deploy-config c.yaml}\n"))
    assert ladder.base is None and ladder.serve_args(ladder.rows[0]) == ["tiny", "--deploy-config", "c.yaml"]


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
    ("profile: {cuda_graphs: false}\nrows:\n  - {name: a, what: x, serve: tiny}\n", "profile: needs a top-level base"),
    ("model: dummy\nrows:\n  - {name: a, what: x, serve: tiny}\n", "model: needs a top-level base"),
    ("rows:\n  - {name: a, what: x, serve: tiny, profile: {kernels: triton}}\n", r"rows\[0\].profile: needs a top-level"),
    ("base: c.yaml\nrows:\n  - {name: a, what: x, profile: [1]}\n", r"rows\[0\].profile: must be a mapping"),
    ("base: c.yaml\nprofile: 3\nrows:\n  - {name: a, what: x}\n", "profile: must be a mapping"),
    ("base: c.yaml\nrows:\n  - {name: a, what: x, serve: --deploy-config d.yaml}\n",
     r"rows\[0\].serve: --deploy-config is set by the ladder's base"),
    ("base: c.yaml\nrows:\n  - {name: a, what: x, serve: '--overrides={}'}\n", r"rows\[0\].serve: --overrides=\{\} is set"),
    ("base: [c.yaml]\nrows:\n  - {name: a, what: x}\n", "base: must be a profile path"),
    ("base: c.yaml\nmodel: --x\nrows:\n  - {name: a, what: x}\n", "model: must be"),
    ("rows:\n  - {name: a, what: x, serve: []}\n", r"rows\[0\].serve: must name the model"),
    ("repeats: 3\nrows:\n  - {name: a, what: x, serve: tiny}\n", "repeats: unknown key"),
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
    [rows] = replot_ladder(ladder, tmp_path, "voice-gateway bench --ladder x --replot")
    assert [(r["name"], r["status"]) for r in rows] == [("slow", "ok"), ("fast", "ok"), ("never", "missing")]
    data = json.loads((tmp_path / "ladder.json").read_text())
    assert data["machine"]["gpu"]["name"] == "NVIDIA H200" and data["command"].endswith("--replot")
    assert data["rounds"] is None  # one round: nothing to pair
    assert "records" not in data["rows"][0]["levels"][0]  # the per-request records stay in <row>.json
    assert data["plots"] == ["req_per_s.png", "ttfp_mean.png", "rtf_mean.png", "ttfp_p99.png",
                             "at_max_concurrency.png"]
    for name in data["plots"]:
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC)
    # rows measured apart as a ladder of their own: only those, in the file's order
    [rows] = replot_ladder(ladder, tmp_path, "voice-gateway bench --ladder x --rows fast,slow --replot",
                           only=["fast", "slow"])
    assert [r["name"] for r in rows] == ["slow", "fast"]
    assert [r["name"] for r in json.loads((tmp_path / "ladder.json").read_text())["rows"]] == ["slow", "fast"]
    with pytest.raises(BenchError, match="no row named 'quick'"):
        replot_ladder(ladder, tmp_path, "x", only=["quick"])


def _row(name: str, levels: list[dict], status: str = "ok", cpu_s: dict[str, float] | None = None,
         place: int | None = None) -> dict:
    """A row of ladder.json as `row_summary` makes it from the row's <row>.json."""
    return row_summary({"label": name, "created": "t", "command": "voice-gateway bench", "config": {},
                        "machine": {}, "levels": levels,
                        "row": {"name": name, "what": "w", "serve_command": "s", "status": status, "error": None,
                                "startup_s": 1.0, "cpu_s": cpu_s, "place": place}})


def test_rounds_pair_each_row_with_the_first_row_of_the_same_round(tmp_path: Path) -> None:
    ladder = load_ladder(_ladder(tmp_path, """
rows:
  - {name: ref, what: baseline, serve: tiny}
  - {name: other, what: + a hop, serve: tiny}
"""))
    # the machine drifts by round (0.5, 0.9, 0.6 s); the other row costs 20, 40 and 30 ms on top,
    # and in round 3 it failed: that round pairs nothing
    rounds = [[_row("ref", [_level(8, 16, 1.0, ref)]),
               _row("other", [_level(8, 16, 1.0, other)], status,
                    {"engine": 30.0 + k, "raylet": 1.0 if k < 3 else 0.5, **({"gcs_server": 0.3} if k == 2 else {})})]
              for k, (ref, other, status) in enumerate([(0.5, 0.52, "ok"), (0.9, 0.94, "ok"), (0.6, 0.63, "failed")], 1)]
    write_ladder(ladder, rounds, tmp_path, command="voice-gateway bench --ladder x --repeats 3", machine={}, commit=None)
    data = json.loads((tmp_path / "ladder.json").read_text())
    assert [r["name"] for r in data["rows"]] == ["ref", "other"]  # round 1, as the figures show it
    summary = data["rounds"]
    assert (summary["count"], summary["reference"]) == (3, "ref")
    ref, other = summary["rows"]
    assert ref["levels"][0]["ttfp_mean_s_by_round"] == [0.5, 0.9, 0.6]
    assert ref["levels"][0]["minus_reference_s"] is None
    level = other["levels"][0]
    assert (level["prompt_words"], level["concurrency"]) == (16, 8)
    assert level["ttfp_mean_s_by_round"] == [0.52, 0.94, None]
    diff = level["minus_reference_s"]
    assert diff["n"] == 2
    assert diff["mean"] == pytest.approx(0.03) and (diff["min"], diff["max"]) == pytest.approx((0.02, 0.04))
    assert diff["stderr"] == pytest.approx(0.01)  # stdev 0.0141 over sqrt(2)
    assert level["ttfp_mean_s"]["mean"] == pytest.approx(0.73)  # the drift the pairing takes out
    # CPU over each sweep, by process: a process missing from a round counts zero there
    assert ref["cpu_s"] is None
    assert other["cpu_s"]["total"]["n"] == 3
    assert other["cpu_s"]["total"]["mean"] == pytest.approx((32.0 + 33.3 + 33.5) / 3)
    assert list(other["cpu_s"]["by_process_mean"]) == ["engine", "raylet", "gcs_server"]
    assert other["cpu_s"]["by_process_mean"]["gcs_server"] == pytest.approx(0.1)
    assert data["plots"] == ["req_per_s.png", "ttfp_mean.png", "rtf_mean.png", "ttfp_p99.png",
                             "at_max_concurrency.png"]


def test_each_round_starts_one_row_later_so_every_row_runs_at_every_place() -> None:
    orders = [round_order(3, k) for k in range(1, 5)]
    assert orders == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]
    for row in range(3):  # over three rounds, each row once at each place
        assert sorted(order.index(row) for order in orders[:3]) == [0, 1, 2]
    assert round_order(1, 7) == [0]


def test_rounds_tell_a_rows_cost_apart_from_the_place_it_ran_at() -> None:
    rows = ("a", "b", "c")
    # the host is 90 ms slower for the row that runs last in a round than for the first
    own = {"a": 0.50, "b": 0.53, "c": 0.56}
    late = [0.0, 0.045, 0.09]
    rounds = []
    for k in range(1, 4):
        order = [rows[i] for i in round_order(3, k)]
        placed = {name: _row(name, [_level(8, 16, 1.0, own[name] + late[place - 1])], place=place)
                  for place, name in enumerate(order, 1)}
        rounds.append([placed[name] for name in rows])
    summary = summarize_rounds(rounds)
    a, b, c = summary["rows"]
    assert (a["place_by_round"], b["place_by_round"], c["place_by_round"]) == ([1, 3, 2], [2, 1, 3], [3, 2, 1])
    # each row's cost against the first comes out whole: the places cancel over the rounds
    assert b["levels"][0]["minus_reference_s"]["mean"] == pytest.approx(0.03)
    assert c["levels"][0]["minus_reference_s"]["mean"] == pytest.approx(0.06)
