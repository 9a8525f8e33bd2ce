# Sourced by speedrun.sh and test.sh: create .venv if missing and install codechat into it; sets VPY.
# CODECHAT_TORCH (default "torch==2.13.0" when no torch is importable) picks the torch build;
# set it to e.g. "torch>=2.11" on a CUDA machine with internet.
# CODECHAT_NO_INSTALL=1 installs nothing: it runs from the checkout with $PYTHON (default python3),
# for a machine without network whose Python already has every runtime dependency (a GPU box). It
# refuses when a runtime dependency is missing, and names the extra's missing packages in a warning
# (what needs them says so when used: the speedrun scores strict calls only with llguidance).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
EXTRA="${1:-}"
if [ "${CODECHAT_NO_INSTALL:-0}" = 1 ]; then
  VPY="$(command -v "$PY")"
  "$VPY" - "$EXTRA" <<'PY'
import importlib.metadata as md, re, sys, tomllib
meta = tomllib.load(open("pyproject.toml", "rb"))["project"]
def missing(reqs):
    out = []
    for r in reqs:
        try:
            md.version(re.match(r"[A-Za-z0-9_.-]+", r).group(0))
        except md.PackageNotFoundError:
            out.append(r)
    return out
extra = sys.argv[1]
if core := missing(meta["dependencies"]):
    sys.exit(f"[setup] CODECHAT_NO_INSTALL=1, but {sys.executable} lacks: {', '.join(core)}")
if extra and (optional := missing(meta["optional-dependencies"][extra])):
    print(f"[setup] warning: {sys.executable} lacks {', '.join(optional)} of the {extra} extra: what needs them "
          f"says so when used (pip install 'codechat[{extra}]')")
print(f"[setup] CODECHAT_NO_INSTALL=1: running from the checkout with {sys.executable}")
PY
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  return 0 2>/dev/null || exit 0
fi
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
echo "[setup] installing codechat${EXTRA:+[$EXTRA]}"
pipq -e ".${EXTRA:+[$EXTRA]}"
# The browser test (tests/test_serve_browser.py) drives Debian's headless Chromium through Selenium
# (chromium-driver matches the browser's version; nothing is downloaded by Selenium itself).
if [ "$EXTRA" = test ] && ! { command -v chromium && command -v chromedriver; } >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" = 0 ] || { sudo -n true 2>/dev/null && SUDO="sudo -n"; }
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || [ -n "$SUDO" ]; }; then
    echo "[setup] installing chromium and chromium-driver (apt) for the browser test"
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver; } \
      >/dev/null 2>&1 || echo "[setup] apt could not install chromium: the browser test will skip and say why"
  else
    echo "[setup] chromium is missing and apt-get cannot run as root here: the browser test will skip and say why"
  fi
fi
export PATH="$ROOT/.venv/bin:$PATH"
