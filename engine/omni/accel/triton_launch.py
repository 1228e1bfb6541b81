"""What every Triton launch of ours shares: the interpreter lock and the dot precision.

The interpreter patches `triton.language` globally while a kernel runs, so two
stage threads interpreting kernels at once break each other. Compiled launches
on a GPU need no lock and take none.
"""

from __future__ import annotations

import contextlib
import os
import threading

import torch

_interpreter_lock = threading.Lock()


def interpreted() -> bool:
    """Whether kernels run in Triton's interpreter (the CPU tests) rather than compiled."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def launch_guard() -> contextlib.AbstractContextManager:
    return _interpreter_lock if interpreted() else contextlib.nullcontext()


def dot_precision(dtype: torch.dtype) -> str:
    """float32 models (the CPU tests, float32 profiles) keep exact float32 products instead of TF32."""
    return "ieee" if dtype == torch.float32 else "tf32"
