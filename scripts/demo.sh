#!/usr/bin/env bash
# Install kvmux with vLLM, then run the demo (a tiny random Llama, memory + disk tiers).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/kvmux demo "$@"
