#!/usr/bin/env bash
# Writes constraints.txt: the version of every package that a fresh install of the project with its `dev`
# extras resolves to (Linux, Python 3.11). scripts/test.sh, scripts/serve.sh and the images install under it,
# so a fresh clone gets what the last lock was tested with, not what the registry published since (an
# unpinned websockets once moved under CI to a release whose new deprecation warning failed the suite).
# Upgrading is a commit of its own: run this, then the full test lane.
#   bash scripts/lock.sh [PIP ARGS]    e.g. `-c old.txt` to hold some versions where they are
set -euo pipefail
cd "$(dirname "$0")/.."
report=$(mktemp)
trap 'rm -f "$report"' EXIT
pip install --quiet --dry-run --ignore-installed --report "$report" "$@" torch==2.13.0 -e '.[dev]'
python - "$report" > constraints.txt <<'PY'
import json
import re
import sys

# torch is named by each install step itself (the CPU wheel here, a CUDA build in the GPU image)
LEFT_OUT = {"torch", "voice-gateway"}
report = json.load(open(sys.argv[1]))
pins = sorted(
    (re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower(), item["metadata"]["version"]) for item in report["install"]
)
print("# Written by scripts/lock.sh: what a fresh install of `.[dev]` resolved to, tested together.")
print(f"# Python {report['environment']['python_full_version']}, {report['environment']['sys_platform']}"
      f" {report['environment']['platform_machine']}.")
for name, version in pins:
    if name not in LEFT_OUT:
        print(f"{name}=={version}")
PY
echo "constraints.txt: $(grep -vc '^#' constraints.txt) packages"
