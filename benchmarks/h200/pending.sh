#!/usr/bin/env bash
# A device session's first calls, each under 10 minutes, from the repo root:
#   run(carry=[".whl"], command="bash benchmarks/h200/pending.sh checks")
#   run(carry=[".whl"], command="bash benchmarks/h200/pending.sh rows <row>,<row>")
# `checks [row]`: the GPU tests (TESTS narrows their -k), the predictor bench, and one ladder row
# (default: parent-admission, the GPU profile) at c=1 and 64. `rows`: any ladder rows (default: the same).
# Results land in $OUT; copy ladder/*.json into benchmarks/h200/ladder/ and --replot here.
source benchmarks/h200/gpu_site.sh >/dev/null 2>&1 || exit 1
OUT=${OUT:-/tmp/out}
case "${1:-checks}" in
  checks)
    timeout 170 python3 -m pytest -q -p no:cacheprovider tests/unit/test_cuda_graphs.py tests/unit/test_static_predictor.py \
      tests/unit/test_reference_equivalence.py tests/unit/test_code2wav_stream.py -k "${TESTS:-cuda or graph}" 2>&1 | tail -6
    timeout 150 python3 benchmarks/h200/predictor_bench.py --out "$OUT/predictor-bench.json" 2>&1 | grep -v Warning | tail -12
    h200_ladder 300 "${2:-parent-admission}" 1,64 ;;
  rows)
    h200_ladder 560 "${2:-parent-admission}" ;;
  *) echo "usage: pending.sh checks|rows [rows]" >&2; exit 2 ;;
esac
