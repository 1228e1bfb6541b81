"""benchmarks/edge_audio.py, the realtime edge's cost probe: its steps run, and its lateness count is right."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PROBE = Path(__file__).parents[2] / "benchmarks" / "edge_audio.py"


def _probe():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("edge_audio", PROBE)
    assert spec is not None and spec.loader is not None, PROBE
    module = importlib.util.module_from_spec(spec)
    sys.modules["edge_audio"] = module
    spec.loader.exec_module(module)
    return module


def test_every_step_is_timed() -> None:
    rows = _probe().step_costs(repeat=1)
    assert {fmt for fmt, _, _ in rows} == {"opus", "pcm16", "g711_ulaw", "chat SSE"}
    assert all(us > 0 for _, _, us in rows), rows


def test_late_pieces_counts_what_a_player_from_the_first_piece_would_wait_for() -> None:
    late = _probe().late_pieces
    count, worst = late([(10.0, 0.0), (10.01, 0.02), (10.05, 0.04)])
    assert count == 0 and abs(worst - 0.01) < 1e-9
    count, worst = late([(10.0, 0.0), (10.2, 0.02), (10.03, 0.04)])
    assert count == 1 and abs(worst - 0.18) < 1e-9
