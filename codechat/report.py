"""The run's report card: compression baselines, the loss-curve plot and ``report.md``."""
from __future__ import annotations

import ast
import gzip
import json
import lzma
import os
from pathlib import Path
from typing import Any, Iterable, Sequence


def compression_baselines(docs: Sequence[bytes]) -> dict[str, float]:
    """Bits per byte of classic compressors on the validation documents.

    ``gzip_bpb``: ``gzip -9`` on each document on its own, total compressed bits over total
    bytes — the fair comparison for a model that starts fresh at every document.
    ``gzip_concat_bpb`` / ``xz_concat_bpb``: the whole split compressed as one stream.
    (Headers are counted, as a file on disk would count them.)
    """
    total = sum(len(d) for d in docs)
    if total == 0:
        raise ValueError("no validation bytes to compress")
    per_doc = sum(len(gzip.compress(d, compresslevel=9, mtime=0)) for d in docs)
    joined = b"".join(docs)
    return {"gzip_bpb": 8 * per_doc / total,
            "gzip_concat_bpb": 8 * len(gzip.compress(joined, compresslevel=9, mtime=0)) / total,
            "xz_concat_bpb": 8 * len(lzma.compress(joined, preset=9)) / total,
            "val_bytes": total, "val_documents": len(docs)}


def parses_after_dropping_last_line(code: str) -> bool:
    """Whether ``code`` minus its last (possibly unfinished) line is valid Python."""
    lines = code.split("\n")
    try:
        ast.parse("\n".join(lines[:-1]) if len(lines) > 1 else "")
        return True
    except (SyntaxError, ValueError):
        return False


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` file (empty when it does not exist)."""
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def plot_loss(rows: Iterable[dict[str, Any]], png: Path, title: str) -> Path:
    """Training loss and validation bits per byte against step, as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(rows)
    fig, ax = plt.subplots(figsize=(7, 4))
    tr = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    va = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    if tr:
        ax.plot(*zip(*tr), label="train loss (nats/token)")
    if va:
        ax.plot(*zip(*va), "o-", label="val loss (nats/token)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def markdown_table(rows: Sequence[tuple[str, Any]]) -> str:
    return "| | |\n|---|---|\n" + "".join(f"| {k} | {_fmt(v)} |\n" for k, v in rows)
