"""pass@k, the pre-RL verdict, and the pass-rate filter.

- :func:`pass_at_k` is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language
  Models Trained on Code", §2.1): with ``n`` samples of which ``c`` pass,
  ``pass@k = 1 - C(n-c, k) / C(n, k)``, computed as a product so it never overflows.
- :func:`verdict` turns pass@1 into the decision before RL (GRPO needs reward variance inside a
  group; with pass@1 < 1 % almost every group is all-zero).
- :func:`bootstrap_interval`: a percentile bootstrap interval of pass@1 over problems; :func:`pass_figures`
  a suite's pass@k, pass@1, its standard error and interval from per-problem counts;
- :func:`filter_by_pass_rate` keeps the problems whose sampled pass rate is inside a range, so
  every RL group has some variance (``codechat eval filter``).
"""
from __future__ import annotations

import json
import math
import operator
from pathlib import Path
from typing import Any, Iterable, Sequence

# ----------------------------------------------------------------------------- pass@k


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem: ``1 - C(n-c, k) / C(n, k)``.

    Args:
        n: samples generated (>= 1).
        c: samples that passed (0 <= c <= n).
        k: the k of pass@k (1 <= k <= n).

    Computed as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` (Chen et al. 2021, §2.1, numerically
    stable form). When ``n - c < k`` every size-k subset holds a pass and the value is exactly
    1.0 -- but only after the inputs were checked: ``k > n`` is an error, never 1.0.

    Raises:
        ValueError: n < 1, k < 1, k > n, c < 0 or c > n.
        TypeError: a non-integer argument.
    """
    n, c, k = operator.index(n), operator.index(c), operator.index(k)
    if n < 1:
        raise ValueError(f"pass@k needs at least one sample, got n={n}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got k={k}")
    if k > n:
        raise ValueError(f"pass@{k} is undefined with only n={n} samples: generate n >= k")
    if not 0 <= c <= n:
        raise ValueError(f"the number of passing samples c={c} must lie in [0, n={n}]")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """Mean of :func:`pass_at_k` over problems given as ``(n, c)`` pairs.

    Raises:
        ValueError: no problems, or any invalid ``(n, c, k)``.
    """
    values = [pass_at_k(n, c, k) for n, c in counts]
    if not values:
        raise ValueError("mean pass@k over zero problems is undefined")
    return math.fsum(values) / len(values)


# ----------------------------------------------------------------------------- verdict
VERDICT_BANDS: tuple[tuple[float, str, str], ...] = (
    # (upper bound of pass@1, key, advice); the last band is open-ended
    (0.01, "stall", "GRPO will stall: almost every group has the same reward (zero variance). "
                    "Strengthen the base first (more pretraining / SFT) before RL"),
    (0.05, "tiered", "use the tiered reward, a group size >= 8 and pass-rate filtering "
                     "(codechat eval filter)"),
    (math.inf, "standard", "standard GRPO should converge"),
)


def bootstrap_interval(rates: Sequence[float], *, level: float = 0.95, resamples: int = 2000,
                       seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of per-problem ``rates`` (pass@1 of each problem):
    resample the problems with replacement ``resamples`` times and take the ``(1 - level) / 2`` and
    ``(1 + level) / 2`` quantiles of the means (Efron & Tibshirani 1993, ch. 13). The interval is
    over problems: it says how much pass@1 would move on another draw of problems like these, not
    the sampling noise within one. Seeded, so a report repeats. None with fewer than 2 problems.

    Raises:
        ValueError: ``level`` outside (0, 1) or ``resamples < 1``.
    """
    if not 0 < level < 1 or resamples < 1:
        raise ValueError(f"need 0 < level < 1 and resamples >= 1, got {level} and {resamples}")
    if len(rates) < 2:
        return None
    import random
    rng, n = random.Random(seed), len(rates)
    means = sorted(math.fsum(rng.choices(rates, k=n)) / n for _ in range(resamples))
    lo, hi = (1 - level) / 2, (1 + level) / 2
    return means[int(lo * (resamples - 1))], means[int(math.ceil(hi * (resamples - 1)))]


def pass_figures(per_task: dict[str, dict[str, int]], ks: Sequence[int]) -> dict[str, Any]:
    """``pass@k`` (``{"pass@K": mean}``), ``pass@1``, its standard error over problems and its 95% bootstrap
    interval (:func:`bootstrap_interval`) from ``{task_id: {"n", "c"}}`` (``results.json``'s
    ``per_task``): also a suite's figures on a subset of its problems.

    Raises:
        ValueError: no problems, or a ``k`` over a problem's ``n``.
    """
    pairs = [(v["n"], v["c"]) for v in per_task.values()]
    p1 = mean_pass_at_k(pairs, 1)
    rates = [pass_at_k(nn, c, 1) for nn, c in pairs]
    stderr = math.sqrt(sum((r - p1) ** 2 for r in rates) / (len(rates) - 1) / len(rates)) if len(rates) > 1 else None
    return {"pass@k": {f"pass@{k}": mean_pass_at_k(pairs, k) for k in ks}, "pass@1": p1, "pass@1_stderr": stderr,
            "pass@1_ci95": bootstrap_interval(rates)}


def verdict_band(pass_at_1: float) -> str:
    """``"stall"`` (pass@1 < 1 %), ``"tiered"`` (1 % <= pass@1 < 5 %) or ``"standard"``.

    Raises:
        ValueError: pass@1 outside [0, 1] or NaN.
    """
    if not 0.0 <= pass_at_1 <= 1.0:  # also rejects NaN
        raise ValueError(f"pass@1 must be a fraction in [0, 1], got {pass_at_1}")
    return next(key for bound, key, _ in VERDICT_BANDS if pass_at_1 < bound)


def verdict(pass_at_1: float) -> str:
    """The pre-RL advice for a measured pass@1 (a fraction), as one printable line."""
    key = verdict_band(pass_at_1)
    advice = next(text for _, k, text in VERDICT_BANDS if k == key)
    rule = {"stall": "< 1%", "tiered": "in [1%, 5%)", "standard": ">= 5%"}[key]
    return f"pass@1 = {pass_at_1:.2%} {rule}: {advice}"


# ----------------------------------------------------------------------------- filter
class EmptyFilterError(ValueError):
    """No problem has a pass rate in the requested range."""


_TASK_FIELDS = ("suite", "split", "prompt", "text", "tests", "test_list", "test_setup_code",
                "entry_point")


def _sample_passed(row: dict[str, Any]) -> bool:
    if "passed" in row:
        return bool(row["passed"])
    if "status" in row:
        return row["status"] == "passed"
    result = row.get("result")
    if isinstance(result, dict) and "status" in result:
        return result["status"] == "passed"
    raise ValueError(f"sample has no 'passed', 'status' or 'result.status' field: "
                     f"{sorted(row)}")


def filter_by_pass_rate(samples_jsonl: str | Path, min_rate: float,
                        max_rate: float) -> list[dict[str, Any]]:
    """Problems whose sampled pass rate c/n lies in ``[min_rate, max_rate]``.

    ``samples_jsonl`` has one sample per line with ``task_id`` and its outcome (``passed``
    bool, or ``status``/``result.status`` equal to ``"passed"``), as written by
    ``codechat eval run``. Returns one dict per kept problem, in first-seen order:
    ``task_id``, ``n``, ``c``, ``pass_rate``, plus the task fields of its first sample
    (``prompt``, ``tests``, ``entry_point``, ... when present).

    Raises:
        ValueError: a bad range, a malformed line, or no samples.
        EmptyFilterError: nothing is in range; the message gives the counts and the verdict.
    """
    if not 0.0 <= min_rate <= max_rate <= 1.0:
        raise ValueError(f"need 0 <= min <= max <= 1, got min={min_rate}, max={max_rate}")
    groups: dict[Any, dict[str, Any]] = {}
    with open(samples_jsonl, encoding="utf-8") as f:
        for lineno, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{samples_jsonl}:{lineno}: not JSON ({e})") from None
            if "task_id" not in row:
                raise ValueError(f"{samples_jsonl}:{lineno}: sample has no task_id")
            key = json.dumps(row["task_id"])
            g = groups.setdefault(key, {"task_id": row["task_id"], "n": 0, "c": 0,
                                        **{k: row[k] for k in _TASK_FIELDS if k in row}})
            g["n"] += 1
            g["c"] += _sample_passed(row)
    if not groups:
        raise ValueError(f"{samples_jsonl} holds no samples")
    for g in groups.values():
        g["pass_rate"] = g["c"] / g["n"]
    kept = [g for g in groups.values() if min_rate <= g["pass_rate"] <= max_rate]
    if not kept:
        rates = [g["pass_rate"] for g in groups.values()]
        mean = math.fsum(rates) / len(rates)
        raise EmptyFilterError(
            f"no problem has a pass rate in [{min_rate}, {max_rate}]: {len(rates)} problems, "
            f"{sum(r == 0 for r in rates)} never solved, {sum(r == 1 for r in rates)} always "
            f"solved. Mean pass rate (pass@1) {mean:.2%} -> verdict: {verdict(mean)}. "
            "RL on these problems would see no reward variance; follow the verdict, or widen "
            "--min/--max.")
    return kept
