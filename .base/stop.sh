#!/usr/bin/env bash
pid=$(cat /root/run/server.pid 2>/dev/null) && { kill -- -"$pid" 2>/dev/null || kill "$pid"; }
for i in $(seq 60); do pgrep -f "voice_gateway.cli serve" >/dev/null || break; sleep 1; done
pkill -9 -f "voice_gateway.cli serve" 2>/dev/null; sleep 2; nvidia-smi --query-gpu=memory.used --format=csv
