"""Every benchmark script imports against the current package (a renamed function once broke
``serve_load.py`` unseen: benchmarks run on a GPU, rarely, and nothing else imported them)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.parametrize("path", sorted(BENCHMARKS.glob("*.py")), ids=lambda p: p.name)
def test_the_benchmark_imports_and_has_a_main(path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the scripts import each other's helpers
    spec = importlib.util.spec_from_file_location(f"benchmark_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)  # top-level code only: each script runs under __main__
    helper = any(f"from {path.stem} import" in other.read_text() for other in BENCHMARKS.glob("*.py") if other != path)
    assert callable(getattr(module, "main", None)) or helper, \
        f"{path.name} has no main() and no other benchmark imports it: its work would run on import"
