#!/usr/bin/env bash
# Where the server's Python time goes at concurrency 64: one GPU-profile server, a bench level at
# c=64 with py-spy sampling who holds the GIL, one without py-spy, and /metrics at the end.
# (Session 8 also ran a level under `py-spy record --idle`: it hung, and the call ran out of time.)
# From the repo root on the H200:
#   run(carry=[".whl", ".tools"], command="bash benchmarks/h200/gil_probe.sh")
# .tools holds the py-spy wheel (py_spy-0.4.3, manylinux). Results in $OUT.
source benchmarks/h200/gpu_site.sh >/dev/null 2>&1 || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/tools .tools/*.whl && export PATH=/tmp/tools/bin:$PATH
PROFILE=${PROFILE:-benchmarks/h200/dummy-fine-prefill.yaml}
python3 -m voice_gateway.cli serve dummy --deploy-config "$PROFILE" --port 8000 $SERVE_ARGS > "$OUT/serve.log" 2>&1 &
PID=$!
for _ in $(seq 300); do curl -sf localhost:8000/health >/dev/null && break; sleep 1; done
echo "server up after ${SECONDS}s"
timeout 20 py-spy dump --pid $PID > "$OUT/dump-idle.txt" 2>&1; echo "py-spy dump rc=$? $(head -c 200 "$OUT/dump-idle.txt")"
level() {  # label, then py-spy record flags
  local label=$1; shift
  [ $# -gt 0 ] && (sleep 3; timeout 30 py-spy record --pid $PID --duration 8 --threads --nonblocking -r 250 -f raw -o "$OUT/$label.txt" "$@" \
     > "$OUT/$label.pyspy.log" 2>&1) &
  [ $# -gt 0 ] && (sleep 6; timeout 20 py-spy dump --pid $PID > "$OUT/$label-dump.txt" 2>&1) &
  timeout 120 python3 -m voice_gateway.cli bench --url http://127.0.0.1:8000 --concurrency 64 --prompt-tokens 32 \
    --num-requests 192 --timeout 60 --label "$label" --out-dir "$OUT/bench" 2>&1 | grep -v "━" | tail -4
  wait
}
level c64-gil --gil
level c64-plain
curl -s localhost:8000/metrics > "$OUT/metrics.txt"
kill -INT $PID; wait $PID
tail -5 "$OUT/serve.log"
