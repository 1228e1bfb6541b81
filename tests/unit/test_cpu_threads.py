"""Stages on the CPU share the process's cores: each op of a stage spreads over cores / stages threads."""

from collections.abc import Iterator

import pytest
import torch

from engine.omni.assemble import _share_cores
from engine.profile import load_profile


@pytest.fixture(autouse=True)
def _keep_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(("cores", "copies", "expected"), [
    ("2", 1, 1),  # the embedded default on two cores: three stages, one thread each
    ("6", 1, 2),
    ("12", 2, 2),  # a thinker, two talkers and two code2wavs
    ("16", 1, 5),
])
def test_each_cpu_stage_gets_its_share(monkeypatch: pytest.MonkeyPatch, cores: str, copies: int,
                                       expected: int) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", cores)
    profile = load_profile(model="tiny", platform="cpu", stage_overrides={
        "talker": {"copies": copies}, "code2wav": {"copies": copies}})
    _share_cores(profile, has_talker=True)
    assert torch.get_num_threads() == expected
    _share_cores(profile, has_talker=True)  # a second engine in the process divides the same cores
    assert torch.get_num_threads() == expected


def test_text_only_thinker_keeps_every_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    _share_cores(load_profile(model="tiny", platform="cpu"), has_talker=False)
    assert torch.get_num_threads() == 4


def test_stages_on_a_gpu_leave_torch_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(3)
    _share_cores(load_profile(model="tiny", platform="cuda"), has_talker=True)
    assert torch.get_num_threads() == 3
