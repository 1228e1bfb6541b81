"""The GPU lane: graphed == eager, compiled == eager, the engine on CUDA. `bash scripts/test_gpu.sh` runs it
on a GPU host; without CUDA every test here skips with that reason."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

# A serving process builds one engine; the lane builds dozens, each compiling its decoder layers for its own
# batch and cache sizes. At Dynamo's default of 8 compilations a function, the later engines captured
# uncompiled layers, so their graphed == eager no longer checked what a server runs.
torch._dynamo.config.recompile_limit = 64


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="the GPU lane needs a CUDA GPU: bash scripts/test_gpu.sh on a GPU host")
    for item in items:
        if "/tests/gpu/" in str(item.path):
            item.add_marker(skip)
