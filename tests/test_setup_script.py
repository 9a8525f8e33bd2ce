"""``scripts/_setup.sh`` with ``CODECHAT_NO_INSTALL=1`` (a machine without network whose Python has the
runtime dependencies, e.g. a GPU box): a missing runtime dependency is an error, a missing package of the
extra asked for only a warning naming it; ``scripts/speedrun.sh`` asks for the serve extra, so the
README's ``codechat serve`` after the speedrun works."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Sources the setup as speedrun.sh does (a statement of its own: in an ``&&`` list bash ignores the
#: ``set -e`` that stops the script at a failed check), then prints what it set.
SOURCE = 'source scripts/_setup.sh serve\necho "VPY=$VPY"\necho "PYTHONPATH=$PYTHONPATH"'


def no_install_setup(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CODECHAT_NO_INSTALL": "1", "PYTHON": sys.executable, "PYTHONPATH": ""}
    return subprocess.run(["bash", "-c", SOURCE], cwd=root, env=env, capture_output=True, text=True, timeout=60)


def checkout(tmp_path: Path, dependencies: list[str], serve: list[str]) -> Path:
    """A checkout holding the real ``scripts/_setup.sh`` and a pyproject.toml with these requirements."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "_setup.sh", tmp_path / "scripts")
    (tmp_path / "pyproject.toml").write_text(f'[project]\nname = "x"\ndependencies = {dependencies!r}\n'
                                             f'[project.optional-dependencies]\nserve = {serve!r}\n')
    return tmp_path


def test_no_install_warns_about_the_extra_and_runs(tmp_path):
    root = checkout(tmp_path, ["numpy>=1.24"], ["numpy", "surely-not-installed-serve-dep>=1"])
    p = no_install_setup(root)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [
        f"[setup] warning: {sys.executable} lacks surely-not-installed-serve-dep>=1 of the serve extra: what needs "
        "them says so when used (pip install 'codechat[serve]')",
        f"[setup] CODECHAT_NO_INSTALL=1: running from the checkout with {sys.executable}",
        f"VPY={sys.executable}", f"PYTHONPATH={root}"]


def test_no_install_refuses_a_python_without_a_runtime_dependency(tmp_path):
    root = checkout(tmp_path, ["numpy>=1.24", "surely-not-installed-core-dep>=1"], ["numpy"])
    p = no_install_setup(root)
    assert p.returncode == 1 and "VPY=" not in p.stdout
    assert p.stderr.strip() == (f"[setup] CODECHAT_NO_INSTALL=1, but {sys.executable} lacks: "
                                "surely-not-installed-core-dep>=1")


def test_the_speedrun_installs_the_serve_extra_which_holds_the_strict_grammar():
    assert 'source "$(dirname "${BASH_SOURCE[0]}")/_setup.sh" serve\n' in (ROOT / "scripts/speedrun.sh").read_text()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"fastapi", "uvicorn"} | {r.split(">")[0] for r in extras["grammar"]} <= \
        {r.split(">")[0] for r in extras["serve"]}
