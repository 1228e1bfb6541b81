"""Files we build ourselves (the tiny checkpoint, the dummy weights' tokenizer) in a cache folder, once.

A build goes to a temporary folder beside its target and is renamed into place, so a crash leaves
nothing half-built, and two processes that build at once both end with one complete copy.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def default_cache_dir() -> Path:
    return Path(os.path.expanduser("~/.cache/voice-gateway"))


def build_once(target: Path, marker: str, build: Callable[[Path], None]) -> Path:
    """`target`, built by `build(folder)` unless it already holds the file `marker` (written last)."""
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / marker).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
