#!/usr/bin/env bash
# Install everything the suite needs, then lint, type-check and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
KVMUX_WITH_REDIS=1 bash scripts/setup.sh
.venv/bin/ruff check src tests
.venv/bin/ruff format --check src tests
.venv/bin/mypy
.venv/bin/python -m pytest -q "$@"
