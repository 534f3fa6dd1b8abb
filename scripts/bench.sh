#!/usr/bin/env bash
# Install what the benchmark needs (vLLM, Redis, LMCache's venv), then run it: bash scripts/bench.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
KVMUX_WITH_REDIS=1 bash scripts/setup.sh
.venv/bin/python -m pip install -q -e ".[bench]" 2>&1 | grep -v "^WARNING: Location" || true
bash scripts/setup-lmcache.sh || echo "kvmux bench: LMCache venv could not be set up; it will be reported as failed"
exec .venv/bin/kvmux bench --lmcache-python .venv-lmcache/bin/python "$@"
