"""The compilers' caches go into the server's cache folder unless the environment names their own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.omni.accel.compiled import CACHES, keep_compiled


def test_the_compilers_keep_their_kernels_in_the_cache_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in CACHES:
        monkeypatch.delenv(variable, raising=False)
    where = keep_compiled(tmp_path / "compiled")
    assert where == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "compiled" / "inductor"),
                     "TRITON_CACHE_DIR": str(tmp_path / "compiled" / "triton")}
    assert {v: os.environ[v] for v in CACHES} == where


def test_a_folder_the_environment_names_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/srv/inductor")
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    where = keep_compiled(tmp_path)
    assert where["TORCHINDUCTOR_CACHE_DIR"] == "/srv/inductor"
    assert where["TRITON_CACHE_DIR"] == str(tmp_path / "triton")
