# On a GPU host without network whose Python already has torch, transformers, numpy, ... but
# no web stack: copy .whl/ (made by benchmarks/h200/fetch_wheels.sh) into the repo there, then,
# from the repo root:
#   source benchmarks/h200/gpu_site.sh && python3 -m voice_gateway.cli bench ...
# Installs the wheels into /tmp/site and puts /tmp/site and the repo on PYTHONPATH. The
# `voice-gateway` script is not installed: use `python3 -m voice_gateway.cli serve|bench ...`.
# No `set -e` here: it would leak into the calling shell.

if [ ! -d .whl ] || ! ls .whl/*.whl >/dev/null 2>&1; then
  echo "gpu_site.sh: no .whl/*.whl under $(pwd): source it from the repo root after copying .whl/ there" >&2
  return 1 2>/dev/null || exit 1
fi

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || { return 1 2>/dev/null || exit 1; }

# Absolute repo path rather than '.', so subprocesses started with another cwd still see it.
export PYTHONPATH="/tmp/site:$PWD"

# tests/conftest.py starts the server with PYTHONPATH=<repo> only; a .pth file in the
# image's site-packages keeps /tmp/site importable there too (appended after the image's
# own packages, none of which .whl duplicates).
_gpu_site_pkgs="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  && { echo /tmp/site > "$_gpu_site_pkgs/zz_gpu_site_wheels.pth"; } 2>/dev/null \
  || echo "gpu_site.sh: could not write a .pth into the image's site-packages; only PYTHONPATH carries /tmp/site" >&2
unset _gpu_site_pkgs
