"""A stage's ``--init``: a codechat checkpoint or stage directory, or ``hf:PATH`` imported first."""
from __future__ import annotations

from pathlib import Path

from .. import checkpoint as ckpt
from ..hf import PREFIX, import_hf, imported_from
from codechat.parallel.world import World, main_first

HF_INIT_DIR = "hf_init"  # where a stage keeps its imported Hugging Face checkpoint


def resolve_init(init: str, out: Path, world: World) -> Path:
    """The checkpoint directory ``init`` means.

    ``hf:PATH`` (a local directory, else a Hub repo id) is imported by rank 0 into
    ``out/hf_init/`` (:func:`codechat.hf.import_hf`), once: a resumed stage finds it there. Anything
    else is :func:`codechat.checkpoint.resolve`.

    Raises:
        CheckpointError: no checkpoint at ``init``. HFImportError: an unsupported HF checkpoint.
    """
    if not init.startswith(PREFIX):
        return ckpt.resolve(init)
    dst = out / HF_INIT_DIR
    with main_first(world):
        if world.main and imported_from(dst) != init:
            out.mkdir(parents=True, exist_ok=True)
            import_hf(init[len(PREFIX):], dst)
    return dst
