"""`codechat speedrun` as a smoke run: every stage, report.md, metrics.json and the plot."""
from __future__ import annotations

import json
import subprocess
import sys


def test_speedrun_smoke_writes_report_and_metrics(tmp_path):
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "codechat", "speedrun", "--out", str(out), "--time-budget-min", "0.25",
                        "--max-files", "150", "--eval-limit", "3", "--device", "cpu"], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    m = json.loads((out / "metrics.json").read_text())
    for stage in ("tokenizer", "data", "baseline", "pretrain", "samples", "sft", "chat", "eval"):
        assert m[stage]["wall_s"] > 0, stage
    pre, base = m["pretrain"], m["baseline"]
    assert pre["steps"] > 0 and pre["val_bpb_final"] < pre["val_bpb_initial"]
    assert 0.5 < base["xz_concat_bpb"] < base["gzip_concat_bpb"] <= base["gzip_bpb"] < 8
    smp = m["samples"]
    assert smp["n"] == 5 and 0 <= smp["parse_ok"] <= 5 and smp["best_of"] == 8
    assert 0 <= smp["parse_ok_first_sample"] <= 5 and 0 <= smp["parse_ok_all_samples"] <= 40
    sft = m["sft"]
    assert sft["steps"] > 0 and sft["examples_kept"] > 0 and 0 < sft["supervised_token_share"] < 1
    assert sft["examples_kept"] + sft["examples_dropped"] == sft["examples_seen"]
    assert sft["loss_initial"] > 0 and sft["loss_final"] > 0
    assert m["eval"]["verdict"] in ("stall", "tiered", "standard") and 0 <= m["eval"]["humaneval"]["pass@1"] <= 1
    assert (out / "eval" / "humaneval" / "results.json").is_file()
    report = (out / "report.md").read_text()
    assert "gzip -9, per document" in report and report.count("```python") == 5
    assert f"{smp['parse_ok']} of 5 parse" in report and "best of 8 samples" in report
    assert "## Chat answers (after SFT)" in report and "PSF License" in report
    assert (out / "loss.png").stat().st_size > 1000
    assert {p.name for p in out.iterdir()} >= {"tokenizer", "data", "pretrain", "sft", "report.md", "metrics.json"}

