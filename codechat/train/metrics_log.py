"""A training stage's per-step log: ``metrics.jsonl`` (one JSON object per logged step), mirrored to
TensorBoard and stdout, and how a resumed run rewrites the rows after its checkpoint."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable


def restart_jsonl(path: Path, resume_step: int | None) -> None:
    """Prepare a per-step JSONL log (rows with a ``step``): emptied for a fresh run; for a run
    resumed at ``resume_step``, the rows after it dropped (the resumed run writes them again)."""
    if resume_step is not None and path.exists():
        keep = [ln for ln in path.read_text().splitlines() if ln and json.loads(ln)["step"] <= resume_step]
        path.write_text("".join(ln + "\n" for ln in keep))
    elif resume_step is None:
        path.write_text("")


class MetricsLog:
    """One JSON object per logged step in ``metrics.jsonl``, mirrored to TensorBoard and stdout."""

    def __init__(self, out_dir: Path, resume_step: int | None) -> None:
        self.path = out_dir / "metrics.jsonl"
        restart_jsonl(self.path, resume_step)
        from torch.utils.tensorboard import SummaryWriter  # slow import, only when training
        self.tb = SummaryWriter(str(out_dir / "tb"), purge_step=resume_step)
        self.file = self.path.open("a")

    def write(self, row: dict[str, Any], echo: Callable[[str], None]) -> None:
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        for k, v in row.items():
            if k != "step" and isinstance(v, (int, float)) and v is not None:
                self.tb.add_scalar(k, v, row["step"])
        echo(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))

    def close(self) -> None:
        self.file.close()
        self.tb.close()


__all__ = ["MetricsLog", "restart_jsonl"]
