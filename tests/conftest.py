"""Session fixtures shared by the whole suite: a small trained tokenizer and a token corpus.

Both are built once per session from the running Python's standard library (a few
seconds on 2 cores):

- ``tok_dir``: a 2048-id tokenizer trained on the train split (``VAL_FRACTION``) of the
  first ``N_FILES`` stdlib files, capped at ``TOK_MAX_BYTES`` of text;
- ``tok``: that tokenizer, loaded;
- ``corpus_dir``: the same ``N_FILES`` files tokenised with it (train and val shards + index.json);
- ``shared_dir``: the ``shared/`` folder cloned beside the repository (test data, failure cases);
- ``write_corpus``: writes texts into files whose names hash into a chosen split.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from codechat.config import default_corpus_dirs
from codechat.data.corpus import build_corpus
from codechat.data.sources import iter_split_texts, split_of
from codechat.tokenizer import Tokenizer, train_tokenizer

TOK_VOCAB = 2048
N_FILES = 200
TOK_MAX_BYTES = 2_000_000
VAL_FRACTION = 0.1
WORKERS = 2


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``shared/`` beside the repository (it is cloned there in CI)."""
    path = Path(__file__).resolve().parents[2] / "shared"
    assert path.is_dir(), f"{path} is missing: clone the shared folder beside the repository"
    return path


@pytest.fixture(scope="session")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of a 2048-id tokenizer trained on a slice of the stdlib's train split."""
    texts = iter_split_texts(default_corpus_dirs(), "train", val_fraction=VAL_FRACTION, max_files=N_FILES,
                             max_bytes=TOK_MAX_BYTES)
    return train_tokenizer(texts, TOK_VOCAB, show_progress=False).save(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def tok(tok_dir: Path) -> Tokenizer:
    return Tokenizer.load(tok_dir)


@pytest.fixture(scope="session")
def corpus_dir(tok_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of train/val shards + index.json: ``N_FILES`` stdlib files, ``VAL_FRACTION`` held out."""
    out = tmp_path_factory.mktemp("corpus")
    build_corpus(default_corpus_dirs(), tok_dir, out, val_fraction=VAL_FRACTION, max_files=N_FILES,
                 workers=WORKERS, show_progress=False)
    return out


@pytest.fixture(scope="session")
def write_corpus() -> Callable[..., Path]:
    """``write_corpus(root, {"train": [texts], "val": [texts]}, val_fraction)`` -> ``root``.

    Each text goes to its own ``.py`` file named so that :func:`split_of` puts it in the
    requested split; within a split, files sort in the order of the texts.
    """
    def write(root: Path, texts_by_split: dict[str, list[str]], val_fraction: float) -> Path:
        root.mkdir(parents=True, exist_ok=True)
        for split, texts in texts_by_split.items():
            k = 0
            for n, text in enumerate(texts):
                while split_of(name := f"{split}{n:04d}_{k}.py", val_fraction) != split:
                    k += 1
                (root / name).write_text(text, encoding="utf-8")
        return root
    return write


@pytest.fixture(scope="session")
def memorise(tok: Tokenizer) -> Callable:
    """``memorise(model, conv, steps, out_dir, max_length, max_prompt_length)``: SFT ``model`` on the
    one conversation ``conv`` for ``steps`` steps (the real renderer, collator and trainer) until it
    reproduces it."""
    from codechat.budget import render_with_budget
    from codechat.config import OptimConfig, RunConfig, SFTConfig, TrainConfig
    from codechat.data.sft import collate
    from codechat.train.trainer import Trainer

    def fit(model, conv, steps: int, out_dir: Path, max_length: int, max_prompt_length: int) -> None:
        ex = render_with_budget(tok, conv, SFTConfig(max_length=max_length, max_prompt_length=max_prompt_length,
                                                     decontaminate=False))
        batch = collate([[ex]], pad_id=tok.end_id, pad_to_multiple=1, packed=False)

        class Same:
            def next_batch(self):
                return batch

            def state_dict(self):
                return {}

            def load_state_dict(self, s):
                pass
        Trainer(model, train=TrainConfig(max_steps=steps, log_every=steps), optim=OptimConfig(lr=3e-3, warmup_steps=5),
                run=RunConfig(out=str(out_dir)), batches=Same(), out_dir=out_dir, show_progress=False).fit()
    return fit
