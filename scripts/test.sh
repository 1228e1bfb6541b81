#!/usr/bin/env bash
# The test lanes (docs/testing.md says what each runs and costs); arguments after the lane go to pytest.
#   bash scripts/test.sh          the full lane, as CI runs it: installs what the tests need on a fresh
#                                 Debian/Ubuntu machine, builds the CPU image, then the checks and every test
#   bash scripts/test.sh --fast   the checks and the unit tests on what is installed already: no installs,
#                                 no docker, no servers (tests/unit and tests/bench less those marked
#                                 `integration` or `slow`)
# The checks: ruff, the import contracts, mypy and the docs build.
set -euo pipefail
cd "$(dirname "$0")/.."

checks() {
  ruff check engine voice_gateway bench tests
  lint-imports  # the architecture's rules: pyproject.toml [tool.importlinter]
  mypy  # pyproject.toml [tool.mypy]
  if [ -f mkdocs.yml ]; then
    # a dead link or anchor, or a page left out of the nav, fails it (mkdocs.yml sets what counts); not
    # --quiet, which drops the warnings before --strict counts them, so that the build passes with them
    site=$(mktemp -d)
    mkdocs build --strict --site-dir "$site"
    rm -rf "$site"
  else
    echo "test.sh: no mkdocs.yml, so no docs build" >&2
  fi
}

if [ "${1:-}" = "--fast" ]; then
  shift
  checks
  exec python -m pytest -n 2 --dist loadscope tests/unit tests/bench -m "not (integration or slow)" "$@"
fi

# espeak-ng speaks the test utterances; chromium runs the demo page (Playwright drives it,
# its own browser download is never used); festival and its slt voice are the assistant's fallback voice.
missing=()
command -v espeak-ng >/dev/null || missing+=(espeak-ng)
command -v text2wave >/dev/null || missing+=(festival)
[ -d /usr/share/festival/voices/us/cmu_us_slt_arctic_hts ] || missing+=(festvox-us-slt-hts)
[ -x /usr/bin/chromium ] || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}"
fi
# torch 2.13.0 first keeps pip on the CPU wheel; the rest at the versions constraints.txt holds (scripts/lock.sh)
pip install torch==2.13.0
pip install -c constraints.txt -e '.[dev]'
pip install --no-deps --require-hashes -r requirements-assistant.txt
checks
bash scripts/docker_ci.sh  # builds the CPU image that tests/integration/test_docker_image.py starts
# Two processes, each taking a module at a time (its servers are started once, in one of them): most tests wait
# on a server or on audio at real-time pace, so two share two cores well. The slowest tests are named at the end:
# the lane's time is a budget (a fresh clone within 35 minutes).
exec python -m pytest -n 2 --dist loadscope --durations=15 "$@"
