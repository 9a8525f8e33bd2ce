# Sourced by speedrun.sh and test.sh: create .venv if missing and install codechat into it.
# CODECHAT_TORCH (default "torch==2.13.0" when no torch is importable) picks the torch build;
# set it to e.g. "torch>=2.11" on a CUDA machine with internet.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
VPY="$ROOT/.venv/bin/python"
# pip, quiet, without the local mirror's "Location ... is ignored" noise; pip's exit status is kept
pipq() { "$VPY" -m pip install -q "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }; }
if ! "$VPY" -c "import torch" 2>/dev/null; then
  echo "[setup] installing ${CODECHAT_TORCH:-torch==2.13.0}"
  pipq "${CODECHAT_TORCH:-torch==2.13.0}"
fi
EXTRA="${1:-}"
echo "[setup] installing codechat${EXTRA:+[$EXTRA]}"
pipq -e ".${EXTRA:+[$EXTRA]}"
export PATH="$ROOT/.venv/bin:$PATH"
