"""The soak's pieces that need no server: its request plan, /proc sampling of a process tree (the ladder's
CPU accounting too), its summary."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from bench.config import BenchError
from bench.procstat import cpu_by_process, process_tree, role, sample_tree
from bench.soak import DEFAULT_MIX, Outcome, SoakConfig, request_plan, summarize


def test_the_plan_is_the_seeded_mix() -> None:
    plan = request_plan(SoakConfig(requests=2000))
    assert plan == request_plan(SoakConfig(requests=2000)) != request_plan(SoakConfig(requests=2000, seed=1))
    counts = Counter(plan)
    total = sum(DEFAULT_MIX.values())
    for kind, share in DEFAULT_MIX.items():
        assert abs(counts[kind] / 2000 - share / total) < 0.03, (kind, counts)
    assert set(request_plan(SoakConfig(requests=50, mix={"chat_text": 1, "realtime_turn": 0}))) == {"chat_text"}
    with pytest.raises(BenchError, match="unknown request kinds"):
        request_plan(SoakConfig(mix={"chat_txt": 1}))


def test_a_process_tree_is_sampled_with_its_children() -> None:
    # a child that itself starts a grandchild, and holds a few files open
    code = ("import subprocess, sys, time; files = [open(sys.executable, 'rb') for _ in range(5)]; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(100):
            if len(process_tree(child.pid)) == 2:
                break
            subprocess.run(["sleep", "0.05"])
        samples = sample_tree(child.pid)
        assert [s.pid for s in samples][0] == child.pid and len(samples) == 2
        assert all(s.rss_kib > 1000 for s in samples)
        assert samples[0].fds >= 3 + 5 and "-c" in samples[0].name
    finally:
        for pid in process_tree(child.pid)[1:]:
            subprocess.run(["kill", str(pid)])
        child.kill()
        child.wait()
    assert process_tree(child.pid) == []


def test_cpu_time_is_told_per_process_of_the_tree(tmp_path: Path) -> None:
    # a child that idles, and a grandchild (a script) that waits a second (after the first sample), spins
    # for half a second of CPU and idles; its path is long, as a Ray daemon's is, so its role comes from
    # the whole command, not the sample's cut name
    (folder := tmp_path / ("site-packages-" * 10)).mkdir()
    spinner = folder / "spinner.py"
    spinner.write_text("import time\ntime.sleep(1)\nt = time.process_time()\nwhile time.process_time() - t < 0.5:\n    pass\ntime.sleep(30)\n")
    code = f"import subprocess, sys, time; subprocess.Popen([sys.executable, {str(spinner)!r}]); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        before = sample_tree(child.pid)
        for _ in range(200):
            spent = cpu_by_process(before, sample_tree(child.pid))
            if spent.get("spinner.py", 0) >= 0.5:
                break
            subprocess.run(["sleep", "0.05"])
        assert spent["spinner.py"] >= 0.5, spent
        assert spent["python -c"] < 0.5 and list(spent)[0] == "spinner.py"
    finally:
        for pid in process_tree(child.pid)[1:]:
            subprocess.run(["kill", str(pid)])
        child.kill()
        child.wait()
    assert role("ray::ReplicaActor") == "ray::ReplicaActor"
    assert role("/opt/ray/core/src/ray/raylet/raylet --node_id=x") == "raylet"
    assert role("/usr/bin/python3.11 -u /opt/ray/_private/log_monitor.py --session-dir=/tmp") == "log_monitor.py"
    assert role("/usr/bin/python3 -m voice_gateway.cli serve tiny --port 1") == "voice_gateway.cli serve"


def test_the_summary_reads_start_end_peak_and_the_late_slope() -> None:
    samples = [{"t_s": float(i), "phase": "traffic", "requests_done": 100 * i, "rss_mib": 500.0 + (2 * i if i else 0),
                "fds": 14 + i % 3, "processes": []} for i in range(11)]
    samples[0]["phase"] = "before"
    samples.append({**samples[-1], "phase": "settled", "rss_mib": 510.0, "fds": 14})
    outcomes = [Outcome("chat_text", True, 0.5)] * 999 + [Outcome("realtime_turn", False, 2.0, "RuntimeError: x")]
    summary = summarize(SoakConfig(), outcomes, samples, traffic_s=100.0)
    assert summary["requests"] == 1000 and summary["failed"] == 1 and summary["req_per_s"] == 10.0
    assert summary["rss_mib"]["start"] == 500.0 and summary["rss_mib"]["end"] == 510.0
    assert summary["rss_mib"]["peak"] == 520.0
    assert summary["rss_mib"]["slope_per_1k_requests"] == pytest.approx(20.0)
    assert summary["fds"] == {"start": 14, "end": 14, "peak": 16}
    assert summary["by_kind"]["realtime_turn"] == {"requests": 1, "failed": 1,
                                                   "latency_s": {"mean": None, "p50": None, "p99": None}}
    assert summary["errors"] == {"RuntimeError: x": 1}
