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
  trace)  # the burst on the engine's clock, in process, on rung 28's engine (rung 30's but for the
    # process), with each reply's submit and first packet; then Code2Wav alone after its input-conv GEMM
    timeout 330 python3 benchmarks/h200/first_packet_trace.py --profile benchmarks/h200/dummy-burst-kernels.yaml \
      --closed-loop 64 --requests 192 --out "$OUT/closed-loop-c64-rung28.json" 2>&1 | grep -v Warning | tail -40
    timeout 200 python3 benchmarks/h200/burst_probe.py --parts code2wav --out "$OUT/burst-probe-3.json" 2>&1 \
      | grep -v Warning | tail -6 ;;
  sched)  # rungs 32 (first_chunk_priority) and 33 (+ code2wav.defer_ahead_s) at c=64, as `ab` ran rung 31
    h200_ladder 570 first-chunk-priority,code2wav-defers 64 --client-processes 4 ;;
  final)  # rung 33 (the GPU profile candidate) at c=1..64, then rung 31 again at c=64 in the same call
    h200_ladder 330 code2wav-defers 1,16,32,64 --client-processes 4
    cp "$OUT/ladder/code2wav-defers.json" "$OUT/code2wav-defers-final.json"
    h200_ladder 250 http-workers 64 --client-processes 4 ;;
  *) echo "usage: session10.sh ab|trace|sched|final" >&2; exit 2 ;;
esac
