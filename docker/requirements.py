"""Prints pyproject.toml's dependencies (and the extras named after it), one a line, so an image can
install them in a layer of their own before the source arrives.

`--data-only` prints instead the requirements we take for a file they ship and never import (pipecat-ai:
the Smart Turn model of the `semantic-vad` extra); the images install those with `pip install --no-deps`,
which keeps their own dependencies (numba, aiohttp, ...) out of the image. Without the flag they are left out.
"""

import re
import sys
import tomllib

DATA_ONLY = {"pipecat-ai"}


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


args = sys.argv[1:]
data_only = args[:1] == ["--data-only"]
pyproject, *wanted = args[1:] if data_only else args
project = tomllib.load(open(pyproject, "rb"))["project"]
extras = project.get("optional-dependencies", {})
for requirement in [*project["dependencies"], *(r for extra in wanted for r in extras[extra])]:
    if (_name(requirement) in DATA_ONLY) == data_only:
        print(requirement)
