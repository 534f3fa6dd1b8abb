#!/usr/bin/env bash
# Check kvmux's GPU path.
#
#   bash scripts/gpu_check.sh --quick [--device cpu] [--json PATH]
#     Minutes, on a bare CUDA machine: python3 with torch, no network, no vLLM
#     (scripts/gpu_check_quick.py says what it checks). `--device cpu` runs the checks a
#     CPU can; CI runs it. A missing wheel (blake3) is taken from scripts/wheels/ or
#     $KVMUX_WHEELS; the error says how to fetch it on a machine with a network.
#
#   bash scripts/gpu_check.sh [--lengths 4096,16384]
#     The full check, on a CUDA machine with a network: installs kvmux beside vLLM's
#     CUDA build (.venv), runs the quick check, the copy tests on the GPU, the engine
#     tests, an engine in bf16 with CUDA graphs (no enforce_eager), and the benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."

# sets $python, and PYTHONPATH for any wheel unpacked from $KVMUX_WHEELS
find_quick_python() {
  python="${PYTHON:-python3}"
  if ! "$python" -c 'import torch' 2>/dev/null; then
    echo "kvmux gpu_check: $python has no torch (set PYTHON=/path/to/python)" >&2
    exit 2
  fi
  local missing
  missing=$("$python" - <<'PY'
import importlib.util
print(" ".join(m for m in ("blake3", "xxhash", "numpy") if importlib.util.find_spec(m) is None))
PY
)
  if [[ -n "$missing" ]]; then
    local wheels="${KVMUX_WHEELS:-scripts/wheels}"
    unpacked=$(mktemp -d)
    trap 'rm -rf "$unpacked"' EXIT
    for module in $missing; do
      local wheel
      wheel=$(ls "$wheels"/"$module"-*.whl 2>/dev/null | head -n 1 || true)
      if [[ -z "$wheel" ]]; then
        local version
        version=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
        echo "kvmux gpu_check: python module '$module' is missing and no wheel is in $wheels." >&2
        echo "  On a machine with a network, fetch it (a few MiB) and carry it here:" >&2
        echo "    pip download $module --no-deps --only-binary=:all: --python-version $version \\" >&2
        echo "      --platform manylinux_2_17_$(uname -m) -d $wheels" >&2
        exit 2
      fi
      "$python" -m zipfile -e "$wheel" "$unpacked"
    done
    export PYTHONPATH="$unpacked${PYTHONPATH:+:$PYTHONPATH}"
  fi
}

if [[ "${1:-}" == "--quick" ]]; then
  shift
  find_quick_python
  PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$python" scripts/gpu_check_quick.py "$@"
  exit
fi

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "kvmux gpu_check: no CUDA GPU here (nvidia-smi); run this on a CUDA machine" >&2
  exit 2
fi
nvidia-smi -L
KVMUX_VLLM="${KVMUX_VLLM:-vllm==0.32.*}" KVMUX_WITH_REDIS=1 bash scripts/setup.sh
.venv/bin/python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "torch sees no CUDA device")'
echo "kvmux gpu_check: the quick check"
PYTHON=.venv/bin/python bash scripts/gpu_check.sh --quick --json bench-results/gpu/quick.json
echo "kvmux gpu_check: copies between a GPU KV cache and host memory"
.venv/bin/python -m pytest -q -rs tests/unit/tier/worker/test_transfer.py tests/unit/tier/worker/test_store_worker.py \
  tests/unit/tier/worker/test_slab.py tests/unit/tier/worker/test_slab_worker.py \
  tests/unit/tier/worker/test_slab_streamed.py
echo "kvmux gpu_check: engines on the GPU (fp32, eager: exact log-probabilities)"
.venv/bin/python -m pytest -q -rs \
  tests/integration/vllm/test_store_connector.py \
  tests/integration/vllm/test_mux_connector.py \
  tests/integration/vllm/test_hybrid.py \
  tests/integration/vllm/test_integrity.py
echo "kvmux gpu_check: an engine in bf16 with CUDA graphs"
.venv/bin/python scripts/gpu_engine_check.py
echo "kvmux gpu_check: TTFT, recompute against memory and disk hits"
.venv/bin/python -m benchmarks.gpu "$@"
