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
    assert m["samples"]["n"] == 5 and 0 <= m["samples"]["parse_ok"] <= 5
    sft = m["sft"]
    assert sft["steps"] > 0 and sft["examples_kept"] > 0 and 0 < sft["supervised_token_share"] < 1
    assert sft["examples_kept"] + sft["examples_dropped"] == sft["examples_seen"]
    assert sft["loss_initial"] > 0 and sft["loss_final"] > 0
    assert m["eval"]["verdict"] in ("stall", "tiered", "standard") and 0 <= m["eval"]["humaneval"]["pass@1"] <= 1
    assert (out / "eval" / "humaneval" / "results.json").is_file()
    report = (out / "report.md").read_text()
    assert "gzip -9, per document" in report and report.count("```python") == 5
    assert "## Chat answers (after SFT)" in report and "PSF License" in report
    assert (out / "loss.png").stat().st_size > 1000
    assert {p.name for p in out.iterdir()} >= {"tokenizer", "data", "pretrain", "sft", "report.md", "metrics.json"}


def test_completions_end_with_the_function_the_prompt_is_in():
    from codechat.report import parses_after_dropping_last_line
    from codechat.speedrun import end_of_block
    method = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    body = "        self.items.append(item)\n\n"
    assert end_of_block(method, body + "    def pop(self):\n        return 1\n") == body
    loop = "def count_words(text):\n    counts = {}\n    for word in text.split():\n"
    rest = "        counts[word] = 1\n    return counts\n\n"
    assert end_of_block(loop, rest + "print(count_words('a'))\n") == rest  # a dedent inside the function is kept
    assert end_of_block("import os\n\n\ndef main():\n", "x = 1\n") == ""  # leaves at once: nothing
    assert end_of_block("def f():\n", "    return 1") == "    return 1"  # still inside: all of it
    assert parses_after_dropping_last_line(method + body) and not parses_after_dropping_last_line(method)
