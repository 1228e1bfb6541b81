#!/usr/bin/env bash
# Builds the CPU image for tests/integration/test_docker_image.py: installs Debian's docker.io (and
# mmdebstrap), starts dockerd where none runs (no systemd: in the background, its log to a file), makes
# a local Debian base where no image registry answers, and builds docker/Dockerfile.cpu.
# Writes what it decided to $VG_DOCKER_STATE (default /tmp/vg-docker/state): `image=TAG` when the image
# is built; `skip=REASON` where docker cannot run here (the test skips with that reason, and the rest of
# the suite runs); `fail=REASON` where docker runs but the base or the image does not build (the test
# fails with it). It exits 0 in every case: the test reports.
set -uo pipefail
cd "$(dirname "$0")/.."
work=${VG_DOCKER_WORK:-/tmp/vg-docker}
state=${VG_DOCKER_STATE:-$work/state}
image=voice-gateway:cpu-ci
base_image=${VG_DOCKER_BASE:-}
mkdir -p "$work"
: > "$state"
docker=/usr/bin/docker  # Debian's: the docker first on PATH may have no BuildKit
export DOCKER_BUILDKIT=1
started=$SECONDS

skip() {
  echo "docker_ci: skipped: $1" >&2
  echo "skip=$1" > "$state"
  exit 0
}
fail() {
  echo "docker_ci: failed: $1" >&2
  echo "fail=$1" > "$state"
  exit 0
}
step() { echo "docker_ci: $1 ($((SECONDS - started)) s)" >&2; }

[ "${VG_DOCKER:-1}" = 0 ] && skip "VG_DOCKER=0"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo -n"
if [ ! -x "$docker" ] || ! command -v mmdebstrap >/dev/null; then
  command -v apt-get >/dev/null || skip "no docker.io and no apt-get to install it"
  step "installing docker.io and mmdebstrap"
  { $sudo apt-get update -qq && $sudo apt-get install -y -qq docker.io mmdebstrap; } >"$work/apt.log" 2>&1 \
    || skip "apt-get install docker.io mmdebstrap failed (see $work/apt.log)"
fi

if ! $sudo "$docker" info >/dev/null 2>&1; then
  step "starting dockerd (log: $work/dockerd.log)"
  $sudo nohup dockerd >"$work/dockerd.log" 2>&1 &
  for _ in $(seq 60); do
    $sudo "$docker" info >/dev/null 2>&1 && break
    sleep 0.5
  done
  $sudo "$docker" info >/dev/null 2>&1 || skip "dockerd did not start: $(tail -n 3 "$work/dockerd.log" | tr '\n' ' ')"
fi

if [ -z "$base_image" ]; then
  base_image=python:3.11-slim-bookworm
  if ! $sudo "$docker" image inspect "$base_image" >/dev/null 2>&1 \
      && ! timeout 60 $sudo "$docker" pull -q "$base_image" >"$work/pull.log" 2>&1; then
    # no registry: bookworm's python3 is 3.11
    base_image=voice-gateway-base:bookworm-espeak  # with the assistant voice's espeak-ng library
    if ! $sudo "$docker" image inspect "$base_image" >/dev/null 2>&1; then
      step "no image registry: making $base_image with mmdebstrap"
      $sudo mmdebstrap --variant=apt --include=python3,python3-venv,python3-pip,ca-certificates,libespeak-ng1 \
          bookworm - 2>"$work/mmdebstrap.log" | $sudo "$docker" import - "$base_image" >/dev/null \
        || fail "mmdebstrap | docker import failed (see $work/mmdebstrap.log)"
    fi
  fi
fi

# A small context of the tree's own files, plus the CPU torch wheel where pip's local wheels have one
# (the image's default torch index may be out of reach here).
context="$work/context"
rm -rf "$context" && mkdir -p "$context"
git ls-files -co --exclude-standard -z | tar -c --null -T - | tar -x -C "$context"
torch_index=https://download.pytorch.org/whl/cpu
if pip download -q --no-deps --dest "$context/docker/wheels" "torch==2.13.0+cpu" >"$work/wheel.log" 2>&1; then
  torch_index=""
fi
secret=()
ca=${VG_DOCKER_CA:-/etc/ssl/certs/ca-certificates.crt}
[ -s "$ca" ] && secret=(--secret "id=ca,src=$ca")  # for a TLS proxy on the way out; never in the image
step "building $image from $base_image (log: $work/build.log)"
$sudo "$docker" build -f "$context/docker/Dockerfile.cpu" --build-arg "BASE=$base_image" \
    --build-arg "TORCH_INDEX_URL=$torch_index" "${secret[@]}" -t "$image" "$context" >"$work/build.log" 2>&1 \
  || fail "docker build failed: $(tail -n 5 "$work/build.log" | tr '\n' ' ')"
step "built $image"
echo "image=$image" > "$state"
