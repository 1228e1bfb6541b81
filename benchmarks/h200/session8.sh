#!/usr/bin/env bash
# Session 8's first device call: rung 22 re-measured with the bench's one-client-per-worker fix at
# c=1..64, then rung 25 (1 ms GIL switch interval) at c=64. From the repo root on the H200:
#   run(carry=[".whl"], command="bash benchmarks/h200/session8.sh")
# Second call (`bash benchmarks/h200/session8.sh trace`): rung 22's in-process closed loop at c=64
# with both waves' stage timelines, then rung 23 (2-frame first chunk) at c=1 and 64.
# Third call (`... session8.sh talker`): rung 26, the Talker prompts built without GPU waits, c=1..64.
source benchmarks/h200/gpu_site.sh >/dev/null 2>&1 || exit 1
OUT=${OUT:-/tmp/out}
if [ "${1:-}" = talker ]; then
  h200_ladder 400 talker-prompt-host 1,16,32,64
  exit
fi
if [ "${1:-}" = trace ]; then
  timeout 280 python3 benchmarks/h200/first_packet_trace.py --profile benchmarks/h200/dummy-fine-prefill.yaml \
    --closed-loop 64 --requests 192 --out "$OUT/closed-loop-c64-rung22.json" 2>&1 | grep -v Warning | tail -3
  h200_ladder 250 first-chunk-2 1,64
  exit
fi
h200_ladder 300 http-stack 1,16,32,64
h200_ladder 240 gil-switch 64
