#!/usr/bin/env bash
# What the next device session should run first, in two calls of ~9 minutes each, from the repo root:
#   run(carry=[".whl"], command="bash benchmarks/h200/pending.sh checks")
#   run(carry=[".whl"], command="bash benchmarks/h200/pending.sh rows")
# `checks`: the GPU tests that have not run on the H200 yet, the first-packet trace with graphed
# prefills, and the graphed-prefill ladder row. `rows`: the chunk-ramp and replicas rows.
# Results land in $OUT; copy ladder/*.json into benchmarks/h200/ladder/ and --replot here.
source benchmarks/h200/gpu_site.sh >/dev/null 2>&1 || exit 1
OUT=${OUT:-/tmp/out}
ladder() {
  timeout "$1" python3 -m voice_gateway.cli bench --ladder benchmarks/h200/ladder.yaml --rows "$2" \
    --concurrency 1,16,32,64 --prompt-tokens 32 --timeout 60 --out-dir "$OUT/ladder" --startup-timeout 150 2>&1 \
    | grep -v "━" | tail -8
}
case "${1:-checks}" in
  checks)
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/unit/test_cuda_graphs.py \
      tests/unit/test_reference_equivalence.py tests/unit/test_code2wav_stream.py -k "cuda or graph" 2>&1 | tail -6
    timeout 110 python3 benchmarks/h200/first_packet_trace.py --profile benchmarks/h200/dummy-graphed-prefill.yaml \
      --out "$OUT/first-packet-trace-graphed-prefill.json" > "$OUT/trace.log" 2>&1 || tail -20 "$OUT/trace.log"
    ladder 200 graphed-prefill ;;
  rows)
    ladder 560 chunk-ramp,replicas ;;
  *) echo "usage: pending.sh checks|rows" >&2; exit 2 ;;
esac
