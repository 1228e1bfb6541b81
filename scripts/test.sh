#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian/Ubuntu machine, then runs every test.
# torch 2.13.0 first keeps pip on the CPU wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
# espeak-ng speaks the test utterances; chromium runs the demo page (Playwright drives it,
# its own browser download is never used).
missing=()
command -v espeak-ng >/dev/null || missing+=(espeak-ng)
[ -x /usr/bin/chromium ] || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}"
fi
pip install torch==2.13.0
pip install -e '.[dev]'
ruff check engine voice_gateway bench tests
lint-imports  # the architecture's rules: pyproject.toml [tool.importlinter]
mypy  # pyproject.toml [tool.mypy]
bash scripts/docker_ci.sh  # builds the CPU image that tests/integration/test_docker_image.py starts
exec python -m pytest "$@"
