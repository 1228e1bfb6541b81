#!/usr/bin/env bash
# Session 10's device calls, from the repo root on the H200:
#   run(carry=[".whl"], command="bash benchmarks/h200/session10.sh ab")
# `ab`: rung 30 (one server process) against rung 31 (four, `serve --http-workers 4`) at c=64 in one
# call, both with the bench's workers in 4 client processes, so neither run waits on the client's GIL.
source benchmarks/h200/gpu_site.sh >/dev/null 2>&1 || exit 1
OUT=${OUT:-/tmp/out}
case "${1:-ab}" in
  ab)
    h200_ladder 560 parent-admission,http-workers 64 --client-processes 4 ;;
  *) echo "usage: session10.sh ab" >&2; exit 2 ;;
esac
