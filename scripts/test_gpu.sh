#!/usr/bin/env bash
# The GPU lane, on a machine with a CUDA GPU and the project installed (or its wheels on PYTHONPATH):
# graphed == eager and compiled == eager (tests/gpu/), and the tests that run on CUDA when it is there.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m pytest tests/gpu tests/unit/test_code2wav_stream.py tests/unit/test_static_predictor.py \
    tests/unit/test_predictor_attention.py tests/unit/test_triton_kernels.py tests/unit/test_packed_attention.py \
    tests/unit/test_fp8.py "$@"
