"""`codechat plan`'s table says that its last figure is the peak, not the sum of the columns, and
gives the formula of each kind of row (compiled, eager) right under it."""
from __future__ import annotations

from codechat.cli import main
from codechat.config.stages import preset
from codechat.train.plan import GIB, COLUMNS, PlanConfig, estimate


def test_the_peak_column_is_explained_under_the_table(capsys):
    args = ["plan", "--preset", "8b", "--gpus", "8", "--parallel", "fsdp", "--ac", "full",
            "--train.micro_batch_size", "1", "--gpu-mem-gb", "80"]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("GiB per GPU"))
    assert lines[head].split()[-1] == "peak"
    row = lines[head + 2].split()  # "* fsdp" (the layout asked for), compiled: the recipe's train.compile
    assert row[:2] == ["*", "fsdp"] and row[-1] == "fits"
    figures = [float(x) for x in row[2:-1]]
    assert len(figures) == len(COLUMNS) + 1
    assert round(sum(figures[:-1]), 1) == 23.5 and figures[-1] == 19.4  # the finding's numbers
    assert lines[head + 3] == ("peak is not the sum of the columns: weights + optim + master + max(activ + logits + "
                               "buffers, grads + step) + margin (a compiled step peaks as its backward starts, before "
                               "any gradient exists)")
    e = estimate(PlanConfig(model=preset("8b", vocab_size=32768), micro_batch_size=1, seq_len=2048, gpus=8,
                            parallel="fsdp", ac="full", compiled=True))
    formula = e.weights + e.optimizer + e.master + max(e.activations + e.logits + e.buffers, e.grads + e.step) + e.margin
    assert abs(formula - e.total) < 1 and round(e.total / GIB, 1) == 19.4

    assert main(args + ["--pp", "2"]) == 0  # pipeline rows peak eagerly: both formulas, each naming its rows
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("peak (")]
    assert [n.split(")")[0] for n in notes] == ["peak (pp2xddp, pp2xfsdp", "peak (ddp, fsdp"]
    assert "weights + optim + master + grads + max(activ + logits + buffers, step) + margin" in notes[0]
