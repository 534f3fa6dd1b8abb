#!/usr/bin/env bash
# Install everything the suite needs, then lint, type-check and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
KVMUX_WITH_REDIS=1 bash scripts/setup.sh
.venv/bin/ruff check src tests benchmarks
.venv/bin/ruff format --check src tests benchmarks
.venv/bin/mypy
.venv/bin/ruff check scripts/gpu_check_quick.py scripts/gpu_engine_check.py
.venv/bin/mypy scripts/gpu_check_quick.py scripts/gpu_engine_check.py
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict -d "$(mktemp -d)"
# the GPU check's CPU mode: no vLLM importable, no network (it refuses both)
PYTHON=.venv/bin/python bash scripts/gpu_check.sh --quick --device cpu --json bench-results/gpu-check-cpu.json
# two workers, each taking whole files (module-scoped engines and servers stay shared)
.venv/bin/python -m pytest -q --durations=30 -n "${KVMUX_TEST_WORKERS:-2}" --dist loadfile "$@"
