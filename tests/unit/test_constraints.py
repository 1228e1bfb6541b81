"""constraints.txt (scripts/lock.sh) pins what pyproject.toml asks for, at versions pyproject.toml allows."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
# torch is pinned by each install step (a CPU or a CUDA build); the gpu extra is not in the CPU lock
NOT_LOCKED = {"torch"}
NOT_LOCKED_EXTRAS = {"gpu"}


def pins() -> dict[str, str]:
    lines = (REPO / "constraints.txt").read_text().splitlines()
    pairs = [line.split("==") for line in lines if line and not line.startswith("#")]
    assert all(len(pair) == 2 for pair in pairs), "one name==version a line"
    return {canonicalize_name(name): version for name, version in pairs}


def requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = [*project["dependencies"], *(r for name, extra in extras.items() if name not in NOT_LOCKED_EXTRAS
                                          for r in extra)]
    return [r for r in map(Requirement, wanted) if canonicalize_name(r.name) != "voice-gateway"]


def test_every_requirement_is_pinned_within_its_range() -> None:
    locked = pins()
    wrong = []
    for requirement in requirements():
        name = canonicalize_name(requirement.name)
        if name in NOT_LOCKED or (requirement.marker is not None and not requirement.marker.evaluate({"extra": ""})):
            continue
        version = locked.get(name)
        if version is None or not requirement.specifier.contains(version, prereleases=True):
            wrong.append(f"{requirement} (locked: {version})")
    assert not wrong, f"run scripts/lock.sh: {wrong}"


def test_torch_is_left_to_the_install_steps() -> None:
    assert "torch" not in pins()
