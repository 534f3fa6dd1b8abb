#!/usr/bin/env bash
# Check kvmux's GPU path in one command, on a CUDA machine:
#   bash scripts/gpu_check.sh [--lengths 4096,16384]
# 1. installs kvmux beside vllm==0.32.* (the CUDA build) in .venv (scripts/setup.sh);
# 2. runs the device-neutral copy tests on the GPU, then the integration tests that start
#    real vLLM engines (on the GPU: exact log-probabilities against a run without
#    connector, StoreConnector and MuxConnector, hybrid models, integrity);
# 3. benchmarks recompute, memory hit and disk hit on a random-weight Llama of Llama 3.2
#    1B's shape, and prints the table (rows also in bench-results/gpu/gpu-bench.json).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "kvmux gpu_check: no CUDA GPU here (nvidia-smi); run this on a CUDA machine" >&2
  exit 2
fi
nvidia-smi -L
KVMUX_VLLM="${KVMUX_VLLM:-vllm==0.32.*}" KVMUX_WITH_REDIS=1 bash scripts/setup.sh
.venv/bin/python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "torch sees no CUDA device")'
echo "kvmux gpu_check: copies between a GPU KV cache and host memory"
.venv/bin/python -m pytest -q -rs tests/unit/tier/test_transfer.py tests/unit/tier/test_worker.py \
  tests/unit/tier/test_slab.py tests/unit/tier/test_slab_worker.py
echo "kvmux gpu_check: engines on the GPU"
.venv/bin/python -m pytest -q -rs \
  tests/integration/vllm/test_store_connector.py \
  tests/integration/vllm/test_mux_connector.py \
  tests/integration/vllm/test_hybrid.py \
  tests/integration/vllm/test_integrity.py
echo "kvmux gpu_check: TTFT, recompute against memory and disk hits"
.venv/bin/python -m kvmux.tools.bench.gpu "$@"
