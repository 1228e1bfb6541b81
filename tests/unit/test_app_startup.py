"""What the app loads at start-up rather than in its first request (each `--http-workers` process has one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

# A fresh interpreter: this one has anyio's backend loaded already (pytest's plugins, httpx).
SCRIPT = """
import asyncio, sys
from pathlib import Path
from engine import create_engine, load_profile
from voice_gateway.app import create_app

app = create_app(create_engine("tiny", load_profile(model="tiny", platform="cpu"), Path(sys.argv[1])))
assert "anyio._backends._asyncio" not in sys.modules, "loaded before start-up: the check below says nothing"

async def main():
    async with app.router.lifespan_context(app):
        print("backend loaded:", "anyio._backends._asyncio" in sys.modules)

asyncio.run(main())
"""


def test_anyio_backend_is_loaded_at_start_up_not_in_the_first_request(tiny_checkpoint: Path, cache_dir: Path) -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(cache_dir)], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "backend loaded: True" in out.stdout


# The engine in a child of its own: the server's process and the engine's each freeze what they built.
FREEZE_SCRIPT = """
import asyncio, gc, logging, sys
from pathlib import Path
from engine import create_engine, load_profile
from voice_gateway.app import create_app

logging.basicConfig(level=logging.INFO)
profile = load_profile(model="tiny", platform="cpu", overrides={"engine": {"where": "process"}})
app = create_app(create_engine("tiny", profile, Path(sys.argv[1])))

async def main():
    print("frozen before start:", gc.get_freeze_count())
    async with app.router.lifespan_context(app):
        print("frozen while serving:", gc.get_freeze_count())
    print("frozen after stop:", gc.get_freeze_count())

asyncio.run(main())
"""


def test_start_up_objects_are_frozen_out_of_the_collector_while_serving(tiny_checkpoint: Path, cache_dir: Path) -> None:
    out = subprocess.run([sys.executable, "-c", FREEZE_SCRIPT, str(cache_dir)], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    counts = {line.split(":")[0]: int(line.split(":")[1]) for line in out.stdout.splitlines() if line.startswith("frozen")}
    assert counts["frozen before start"] == 0
    assert counts["frozen while serving"] > 10_000  # the imports alone are more: a walk of them is what stalls
    assert counts["frozen after stop"] == 0  # given back: a process that starts another server keeps no garbage
    engine_line = [line for line in out.stderr.splitlines() if "[engine]" in line and "frozen out of the cyclic collector" in line]
    assert engine_line, out.stderr[-3000:]  # the engine's own process froze its start-up too
