"""The profile's `stages.gil_switch_interval_ms` holds while the engine runs, and no longer after."""

from __future__ import annotations

import sys
from pathlib import Path

from engine import create_engine, load_profile


async def test_the_engine_sets_its_gil_switch_interval_while_it_runs(tiny_checkpoint: Path, cache_dir: Path) -> None:
    prior = sys.getswitchinterval()
    profile = load_profile(model="tiny", platform="cpu", stage_overrides={"gil_switch_interval_ms": 0.5})
    engine = create_engine("tiny", profile, cache_dir)
    await engine.start()
    try:
        assert sys.getswitchinterval() == 0.0005
    finally:
        await engine.stop()
    assert sys.getswitchinterval() == prior

