"""pass@k (case 10), the pre-RL verdict, and the pass-rate filter.

Case 10 of ``shared/cases`` is checked when ``shared/`` is there; the same rules are pinned on the
project's own rows (``VALID``, ``DEGENERATE``) whether or not it is."""
from __future__ import annotations

import argparse
import json
import math
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from codechat.eval import cli as eval_cli
from codechat.eval import passk

from conftest import shared_params

CASE_10 = "cases/10-passk-n-lt-k.json"


def exact_pass_at_k(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def _nck(r: dict) -> str:
    return f"n{r['n']}-c{r['c']}-k{r['k']}"


@pytest.mark.parametrize("row", shared_params(CASE_10, lambda p: json.loads(p.read_text())["valid"], _nck))
def test_case_10_valid_values(row):
    assert passk.pass_at_k(row["n"], row["c"], row["k"]) == pytest.approx(row["expected"], abs=1e-9)


@pytest.mark.parametrize("row", shared_params(CASE_10, lambda p: json.loads(p.read_text())["degenerate"], _nck))
def test_case_10_degenerate_inputs_raise(row):
    with pytest.raises(ValueError):
        passk.pass_at_k(row["n"], row["c"], row["k"])


# The same rules on the project's own rows. Expected values are 1 - C(n-c,k)/C(n,k) worked by hand
# (written out to 12 places, so a wrong formula is caught to 1e-9, not only a crash).
VALID = [
    (5, 2, 1, 0.4),                # 1 - 3/5
    (5, 2, 2, 0.7),                # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (8, 1, 3, 0.375),              # 1 - C(7,3)/C(8,3) = 1 - 35/56
    (50, 3, 10, 0.495918367347),   # 1 - (40*39*38)/(50*49*48) = 1 - 247/490
    (12, 4, 6, 0.969696969697),    # 1 - C(8,6)/C(12,6) = 1 - 28/924
    (5, 2, 4, 1.0),                # n - c < k: every draw of 4 holds a correct sample
    (3, 1, 3, 1.0),                # k == n with one correct
    (3, 0, 3, 0.0),                # k == n with none correct: not the shortcut's 1.0
    (6, 0, 2, 0.0),
    (6, 6, 1, 1.0),
    (1, 1, 1, 1.0),
    (1, 0, 1, 0.0),
]
DEGENERATE = [
    (0, 0, 1, "n < 1 (no samples)"),
    (-3, 0, 1, "n < 1"),
    (4, 1, 0, "k < 1"),
    (4, 1, -2, "k < 1"),
    (3, 0, 4, "k > n: the shortcut `if n - c < k: return 1.0` gives 1.0"),
    (3, 2, 7, "k > n"),
    (1, 1, 2, "k > n with every sample correct"),
    (4, -1, 2, "c < 0"),
    (4, 5, 1, "c > n"),
    (4, 5, 4, "c > n and k == n"),
]


@pytest.mark.parametrize("n,c,k,expected", VALID, ids=[f"n{n}-c{c}-k{k}" for n, c, k, _ in VALID])
def test_valid_values_to_1e9(n, c, k, expected):
    assert passk.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-9)
    assert float(exact_pass_at_k(n, c, k)) == pytest.approx(expected, abs=1e-9)  # the hand values are right


@pytest.mark.parametrize("n,c,k,why", DEGENERATE, ids=[f"n{n}-c{c}-k{k}" for n, c, k, _ in DEGENERATE])
def test_degenerate_inputs_raise_and_never_return_one(n, c, k, why):
    with pytest.raises(ValueError):
        passk.pass_at_k(n, c, k)
    with pytest.raises(ValueError):  # nor through the mean over problems
        passk.mean_pass_at_k([(n, c)], k)


def test_k_larger_than_n_is_never_one():
    # the shortcut `if n - c < k: return 1.0` before validation would give 1.0 here
    with pytest.raises(ValueError, match="undefined"):
        passk.pass_at_k(2, 0, 5)


def test_non_integers_are_rejected():
    with pytest.raises(TypeError):
        passk.pass_at_k(10.0, 3, 1)  # type: ignore[arg-type]


@given(st.integers(1, 400).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n),
                                                       st.integers(1, n))))
def test_matches_the_exact_binomial_formula(nck):
    n, c, k = nck
    assert passk.pass_at_k(n, c, k) == pytest.approx(float(exact_pass_at_k(n, c, k)), abs=1e-12)


def test_stable_for_large_n():
    # C(2000, 1000) overflows a float; the product form does not
    assert passk.pass_at_k(2000, 10, 1000) == pytest.approx(
        float(exact_pass_at_k(2000, 10, 1000)), abs=1e-12)
    assert passk.pass_at_k(100000, 1, 1) == pytest.approx(1e-5, rel=1e-12)


def test_mean_over_problems():
    assert passk.mean_pass_at_k([(10, 3), (10, 0), (10, 10)], 1) == pytest.approx((0.3 + 0 + 1) / 3)
    with pytest.raises(ValueError):
        passk.mean_pass_at_k([], 1)
    with pytest.raises(ValueError):
        passk.mean_pass_at_k([(10, 3), (2, 0)], 5)


@pytest.mark.parametrize("p,band", [(0.0, "stall"), (0.0099, "stall"), (0.01, "tiered"),
                                    (0.0499, "tiered"), (0.05, "standard"), (1.0, "standard")])
def test_verdict_bands(p, band):
    assert passk.verdict_band(p) == band
    text = passk.verdict(p)
    assert text.startswith(f"pass@1 = {p:.2%}")
    assert {"stall": "GRPO will stall", "tiered": "tiered reward",
            "standard": "standard GRPO should converge"}[band] in text


@pytest.mark.parametrize("p", [-0.01, 1.01, float("nan")])
def test_verdict_rejects_non_fractions(p):
    with pytest.raises(ValueError):
        passk.verdict(p)


def _write_samples(path: Path, passes: dict[str, list[bool]]) -> Path:
    with open(path, "w") as f:
        for task_id, outcomes in passes.items():
            for i, ok in enumerate(outcomes):
                f.write(json.dumps({"task_id": task_id, "sample": i, "prompt": f"solve {task_id}",
                                    "completion": "...", "passed": ok}) + "\n")
    return path


def test_filter_keeps_problems_with_reward_variance(tmp_path):
    samples = _write_samples(tmp_path / "samples.jsonl", {
        "never": [False] * 10, "once": [True] + [False] * 19, "half": [True, False] * 5,
        "always": [True] * 10})
    kept = passk.filter_by_pass_rate(samples, 0.05, 0.95)
    assert [(k["task_id"], k["n"], k["c"], k["pass_rate"]) for k in kept] == [
        ("once", 20, 1, 0.05), ("half", 10, 5, 0.5)]
    assert kept[0]["prompt"] == "solve once" and "completion" not in kept[0]


def test_filter_accepts_status_fields(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"task_id": 1, "status": "passed"}, {"task_id": 1, "result": {"status": "failed"}}]))
    assert passk.filter_by_pass_rate(path, 0.5, 0.5)[0]["c"] == 1


def test_empty_filter_is_an_error_pointing_at_the_verdict(tmp_path):
    samples = _write_samples(tmp_path / "samples.jsonl", {"a": [False] * 8, "b": [False] * 8})
    with pytest.raises(passk.EmptyFilterError) as e:
        passk.filter_by_pass_rate(samples, 0.05, 0.95)
    msg = str(e.value)
    assert "2 problems, 2 never solved" in msg
    assert "verdict" in msg and "GRPO will stall" in msg


def test_filter_rejects_bad_ranges(tmp_path):
    samples = _write_samples(tmp_path / "s.jsonl", {"a": [True]})
    for lo, hi in [(0.5, 0.4), (-0.1, 0.5), (0.1, 1.5)]:
        with pytest.raises(ValueError):
            passk.filter_by_pass_rate(samples, lo, hi)


def test_cli_filter(tmp_path, capsys):
    samples = _write_samples(tmp_path / "samples.jsonl", {"x": [True, False], "y": [False] * 2})
    parser = argparse.ArgumentParser()
    eval_cli.add_cli(parser.add_subparsers(dest="command"))
    out = tmp_path / "tasks.jsonl"
    args = parser.parse_args(["eval", "filter", "--samples", str(samples), "--out", str(out)])
    assert args.func(args) == 0
    assert [json.loads(line)["task_id"] for line in out.read_text().splitlines()] == ["x"]
    args = parser.parse_args(["eval", "filter", "--samples", str(samples), "--min", "0.9",
                              "--out", str(out)])
    assert args.func(args) == 1
    assert "verdict" in capsys.readouterr().err


def test_the_bootstrap_interval_holds_the_mean_narrows_with_more_problems_and_repeats():
    from codechat.eval.passk import bootstrap_interval
    rates = [1.0] * 3 + [0.0] * 97  # pass@1 3% over 100 problems
    lo, hi = bootstrap_interval(rates)
    assert 0.0 <= lo < 0.03 < hi <= 0.08 and (lo, hi) == bootstrap_interval(rates)  # seeded: a report repeats
    wide = bootstrap_interval([1.0] + [0.0] * 32)  # the same 3% over 33 problems: wider
    assert wide[1] - wide[0] > hi - lo
    assert bootstrap_interval([0.5, 0.5, 0.5]) == (0.5, 0.5) and bootstrap_interval([0.2]) is None
    with pytest.raises(ValueError, match="0 < level < 1"):
        bootstrap_interval(rates, level=1.0)
