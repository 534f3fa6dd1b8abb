#!/usr/bin/env bash
# Install what the benchmark needs (vLLM, Redis, LMCache's venv), then run it: bash scripts/bench.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
KVMUX_WITH_REDIS=1 bash scripts/setup.sh
# TCMalloc for every engine, as vLLM's CPU backend asks (benchmarks/allocator.py)
if ! .venv/bin/python -c "import sys; from benchmarks.allocator import find_tcmalloc; sys.exit(find_tcmalloc() is None)" \
  && command -v apt-get >/dev/null 2>&1; then
  echo "benchmarks: installing libtcmalloc-minimal4 from Debian"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libtcmalloc-minimal4 >/dev/null; } \
    || echo "benchmarks: TCMalloc could not be installed; the engines use the system's allocator"
fi
.venv/bin/python -m pip install -q -r benchmarks/requirements.txt
bash scripts/setup-lmcache.sh || echo "benchmarks: LMCache venv could not be set up; it will be reported as failed"
exec .venv/bin/python -m benchmarks --lmcache-python .venv-lmcache/bin/python "$@"
