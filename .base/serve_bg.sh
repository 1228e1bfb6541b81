#!/usr/bin/env bash
# start a detached GPU-profile server (SERVE_OVERRIDES as serve_and_bench.sh), wait until ready
set -uo pipefail
source benchmarks/h200/gpu_site.sh
ov=${SERVE_OVERRIDES:-'{"load_format":"dummy","stages":{"thinker":{"default_max_tokens":40,"ignore_eos":true},"talker":{"max_frames":125,"ignore_eos":true}}}'}
mkdir -p /root/run
log=/root/run/server-${TAG:-a}.log
started=$(date +%s)
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VOICE_GATEWAY_API_KEY= setsid nohup python3 -m voice_gateway.cli serve \
  --host 0.0.0.0 --port 8000 dummy --public-metrics --allowed-hosts localhost --overrides "$ov" \
  >"$log" 2>&1 </dev/null &
echo $! >/root/run/server.pid
until python3 -c 'import httpx,sys; sys.exit(httpx.get("http://127.0.0.1:8000/health").status_code != 200)' 2>/dev/null; do
  kill -0 "$(cat /root/run/server.pid)" 2>/dev/null || { echo "server exited"; tail -40 "$log"; exit 1; }
  [ $(( $(date +%s) - started )) -gt ${READY_MAX:-400} ] && { echo "not ready"; tail -20 "$log"; exit 1; }
  sleep 2
done
echo "server ready in $(( $(date +%s) - started )) s"
grep -h "capacity:\|GPU memory after\|captured\|attached" "$log" | cut -c1-400 | tail -12
