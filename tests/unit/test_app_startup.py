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
