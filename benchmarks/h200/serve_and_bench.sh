#!/usr/bin/env bash
# One GPU-profile server (dummy weights, the bench's reply lengths), then each bench run against it, in order.
#   bash benchmarks/h200/serve_and_bench.sh OUT_DIR "bench args ..." ["bench args ..." ...]
# The server runs as the GPU image does (docker/Dockerfile.gpu's entrypoint, docker/compose.yaml's
# command and environment), with the dummy model in place of the checkpoint. Every run gets --url
# and --out-dir OUT_DIR. OUT_DIR also gets server.log, metrics-N.txt (the server's /metrics after
# run N), cpu-N.txt (the CPU seconds each of the server's processes has spent by the end of run N) and
# cold-work.txt (the log's lines about work after ready). SERVE_OVERRIDES replaces the default --overrides. Run from the repo root, after gpu_site.sh on a host without network.
set -uo pipefail
out=$1; shift
mkdir -p "$out"
overrides=${SERVE_OVERRIDES:-'{"load_format":"dummy","stages":{"thinker":{"max_model_len":2048,"default_max_tokens":40,"ignore_eos":true},"talker":{"max_frames":125,"ignore_eos":true}}}'}
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VOICE_GATEWAY_API_KEY= python3 -m voice_gateway.cli serve \
  --host 0.0.0.0 --port 8000 dummy --public-metrics --allowed-hosts localhost --overrides "$overrides" \
  >"$out/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
started=$(date +%s)
until python3 -c 'import httpx,sys; sys.exit(httpx.get("http://127.0.0.1:8000/health").status_code != 200)' 2>/dev/null; do
  kill -0 $server 2>/dev/null || { echo "server exited"; tail -40 "$out/server.log"; exit 1; }
  sleep 2
done
echo "server ready in $(( $(date +%s) - started )) s"
run=0
for args in "$@"; do
  run=$((run + 1))
  echo "== bench $run: $args"
  # shellcheck disable=SC2086
  python3 -m voice_gateway.cli bench --url http://127.0.0.1:8000 --out-dir "$out" $args 2>&1 | tail -25
  python3 -c 'import httpx; print(httpx.get("http://127.0.0.1:8000/metrics").text)' >"$out/metrics-$run.txt"
  ps -o pid,ppid,cputimes,rss,args --ppid $server --pid $server | cut -c1-200 >"$out/cpu-$run.txt"
done
sleep 3  # replies the bench left are aborted: what the stages still count after that is a leak
python3 -c 'import httpx; print(httpx.get("http://127.0.0.1:8000/health").text)' >"$out/health-after.json"
grep -h "cold work\|captured\|warmed" "$out/server.log" >"$out/cold-work.txt"
grep -c "cold work after ready" "$out/server.log" | sed 's/^/cold work events: /'
