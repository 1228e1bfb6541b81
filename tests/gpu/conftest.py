"""The GPU lane: graphed == eager, compiled == eager, the engine on CUDA. `bash scripts/test_gpu.sh` runs it
on a GPU host; without CUDA every test here skips with that reason."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="the GPU lane needs a CUDA GPU: bash scripts/test_gpu.sh on a GPU host")
    for item in items:
        if "/tests/gpu/" in str(item.path):
            item.add_marker(skip)
