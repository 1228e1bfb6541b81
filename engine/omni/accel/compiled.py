"""Where the kernels that torch.compile and Triton build at start-up are kept: in the server's cache folder, so that
the next start on the machine (or in a container whose cache folder is a volume) loads them instead of compiling.

On an H100 most of a cold start is compiling (the decoder layers through inductor while their graphs are captured,
and our Triton kernels): ready in 219 s, then 97 s and 90 s for the next two starts on that machine
(docs/performance/gpu-sweep.md). By default inductor keeps its files under /tmp and Triton under ~/.triton, which a
recreated container loses. A folder set by environment wins."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

CACHES = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}


def keep_compiled(folder: Path) -> dict[str, str]:
    """Point the compilers' caches into `folder` where the environment names none; returns where each one is. Called
    before anything compiles: both read their variable when they first write."""
    where = {}
    for variable, name in CACHES.items():
        where[variable] = os.environ.setdefault(variable, str(folder / name))
    log.info("compiled kernels kept in %s", ", ".join(f"{v}={p}" for v, p in where.items()))
    return where
