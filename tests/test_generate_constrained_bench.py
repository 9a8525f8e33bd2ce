"""``benchmarks/generate_throughput.py --constrained`` (issue 35) on a tiny CPU model: the three arms
run, the JSON lands in ``$OUT/generate_constrained.json`` with its figures, and every finished
constrained row is a valid call (parse failures are printed by the script and must be 0)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("llguidance")
ROOT = Path(__file__).resolve().parent.parent


def test_constrained_bench_runs_and_every_call_parses(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "generate_throughput.py"), "--constrained", "--preset", "tiny",
           "--vocab-size", "1024", "--device", "cpu", "--rows", "4", "--schemas", "4", "--new-tokens", "96",
           "--prompt-len", "8", "--repeats", "1", "--tokenizer-bytes", "1000000", "--ab-commit", ""]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    print(res.stdout, res.stderr[-3000:])
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads((tmp_path / "generate_constrained.json").read_text())
    f = data["figures"]
    for arm in ("free", "one_schema", "eight_schemas"):
        assert f[f"{arm}_tok_s"] > 0 and f[f"{arm}_tokens"] >= 4 * 96
    assert f["free_mean_row_tokens"] == 96  # free rows have no stop: exactly --new-tokens each
    assert 0 < f["one_schema_vs_free"] and 0 < f["eight_schemas_vs_free"]
    assert f["constrained_rows_checked"] > 0
    assert f["parse_failures"] == 0, data["failures"]
    assert data["ab"] == {"skipped": "--ab-commit ''"}
    assert data["rows"] == 4 and data["schemas"] == 4 and len(data["tools"]) == 4
