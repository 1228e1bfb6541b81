"""What a result ran on: platform, CPU, library versions and (for ladders) the GPU through torch.

Deliberately no hostname (platform.node()): results get committed and shared.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor()


def gpu_info() -> dict[str, Any] | None:
    """The GPUs torch sees in this process, or None without torch or CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return {"name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count(),
            "memory_gib": round(props.total_memory / 2**30, 1), "cuda": torch.version.cuda}


def git_commit(cwd: Path | None = None) -> str | None:
    """HEAD of the working tree the command runs in, with `-dirty` when it has local changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def machine_info(with_gpu: bool = False) -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(), "machine": platform.machine(), "processor": _cpu_model(),
        "cpu_count": os.cpu_count(), "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "versions": {d: _version(d) for d in ("torch", "transformers", "httpx", "voice-gateway")},
    }
    if with_gpu:  # imports torch (seconds) and opens CUDA in this process: only where it is worth it
        info["gpu"] = gpu_info()
    return info
