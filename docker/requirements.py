"""Prints pyproject.toml's dependencies (and the extras named after it), one a line, so an image can
install them in a layer of their own before the source arrives."""

import sys
import tomllib

project = tomllib.load(open(sys.argv[1], "rb"))["project"]
extras = project.get("optional-dependencies", {})
for requirement in [*project["dependencies"], *(r for extra in sys.argv[2:] for r in extras[extra])]:
    print(requirement)
