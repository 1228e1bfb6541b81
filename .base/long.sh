#!/usr/bin/env bash
# 32 x 80 staggered against the running server: long.sh TAG [more bench args]; JSON to $OUT
set -uo pipefail
source benchmarks/h200/gpu_site.sh
tag=$1; shift
python3 -m voice_gateway.cli bench --url http://127.0.0.1:8000 --out-dir /root/out/$tag --realtime \
  --concurrency ${C:-32} --turns ${TURNS:-80} --turn-mode commit --output-format pcm16 --timeout 60 --client-processes 4 \
  --input-speed 4 --warmup 2 --spread-s 30 --time-limit ${LIMIT:-300} --label $tag "$@" 2>&1 | grep -v "^\s*$" | tail -40
cp /root/out/$tag/$tag.json "$OUT/" 2>/dev/null
cp /root/out/$tag/$tag.png "$OUT/" 2>/dev/null
log=$(ls -t /root/run/server-*.log | head -1)
grep -c "waited\|refused" "$log" | sed 's/^/waited-or-refused lines: /'
