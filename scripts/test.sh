#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian/Ubuntu machine, then runs every test.
# espeak-ng speaks the test utterances; torch 2.13.0 first keeps pip on the CPU wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v espeak-ng >/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq && apt-get install -y -qq espeak-ng
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq espeak-ng
  fi
fi
pip install torch==2.13.0
pip install -e '.[dev]'
ruff check engine voice_gateway tests
exec python -m pytest "$@"
