#!/usr/bin/env bash
# Session 9's device calls, from the repo root on the H200:
#   run(carry=[".whl"], command="bash benchmarks/h200/session9.sh probe")
# `probe`: the burst's GPU work alone (burst_probe.py: MoE tiles at prefill sizes, Code2Wav variants,
# the Thinker's 64-prompt prefill), then the GPU tests of the kernels and graphs.
# `probe2`: Code2Wav with the one-channel GEMM and the fused SnakeBeta, the prefill with compiled layers,
# and the GPU tests of the graphs (compiled prefill graphs included) and kernels.
source benchmarks/h200/gpu_site.sh >/dev/null 2>&1 || exit 1
OUT=${OUT:-/tmp/out}
case "${1:-probe}" in
  probe)
    timeout 330 python3 benchmarks/h200/burst_probe.py --out "$OUT/burst-probe.json" 2>&1 | grep -v Warning | tail -20
    timeout 220 python3 -m pytest -q -p no:cacheprovider -p no:logging tests/unit/test_triton_kernels.py \
      tests/unit/test_cuda_graphs.py tests/unit/test_code2wav_stream.py tests/unit/test_static_predictor.py \
      -k "${TESTS:-cuda or graph or snake or fused or gpu}" 2>&1 | tail -8 ;;
  probe2)  # after the first probe: Code2Wav's kernels and the compiled prefill, then their GPU tests
    timeout 300 python3 benchmarks/h200/burst_probe.py --parts code2wav,prefill --out "$OUT/burst-probe-2.json" 2>&1 \
      | grep -v Warning | tail -8
    timeout 250 python3 -m pytest -q -p no:cacheprovider -p no:logging tests/unit/test_cuda_graphs.py \
      tests/unit/test_code2wav_stream.py tests/unit/test_triton_kernels.py 2>&1 | tail -8 ;;
  row)  # rung 28 burst-kernels: Code2Wav's GPU tests (its GEMM convolutions in bf16 and in graphs), then the row
    timeout 120 python3 -m pytest -q -p no:cacheprovider -p no:logging tests/unit/test_code2wav_stream.py \
      tests/unit/test_triton_kernels.py -k "snake or gpu or graph" 2>&1 | tail -3
    h200_ladder 420 burst-kernels "${2:-1,16,32,64}" ;;
  process)  # rung 29 (the engine in its own process) at c=1 and 64, then rung 28 again at 64 in the same call
    h200_ladder 280 engine-process 1,64
    h200_ladder 250 burst-kernels 64 ;;
  final)  # rung 30 (parent-admission) at c=1..64
    h200_ladder 420 parent-admission 1,16,32,64 ;;
  clients)  # next session's first call: rung 30 at c=64 with the bench's workers in 1, then 4 client
    # processes (two servers, one row name: the second run's JSON replaces the first's, so copy it out)
    h200_ladder 250 parent-admission 64 && cp "$OUT/ladder/parent-admission.json" "$OUT/parent-admission-p1.json"
    h200_ladder 250 parent-admission 64 --client-processes 4 ;;
  workers)  # then rung 31: four server processes in front of the engine, with 4 client processes
    h200_ladder 300 http-workers 1,64 --client-processes 4 ;;
  *) echo "usage: session9.sh probe|probe2|row|process|final|clients|workers" >&2; exit 2 ;;
esac
