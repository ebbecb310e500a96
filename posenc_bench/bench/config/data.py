"""The ``data`` section: the corpus, how it is split and the tokenizer it is read with; ``load_run_corpus``
reads it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from posenc_bench.data import Corpus, load_corpus
from posenc_bench.errors import ConfigError
from posenc_bench.tokenizer import load_tokenizer


@dataclass
class DataConfig:
    source: str = "stdlib"  # stdlib | shakespeare | sotu | <path or glob> | hf:<dataset>[:<config>]
    text_field: str = "text"  # column of an hf: dataset
    tokenizer: str = "bytes"  # bytes | bpe-<vocab>: a BPE trained on the train split (tokenizer.py)
    valid_fraction: float = 0.05
    test_fraction: float = 0.05


def validate_data(d: DataConfig) -> None:
    """ConfigError unless the valid and test fractions leave a train split."""
    if not (0 <= d.valid_fraction and 0 < d.test_fraction and d.valid_fraction + d.test_fraction < 1):
        raise ConfigError("data.valid_fraction and data.test_fraction must be fractions with test > 0 and sum < 1")


def load_run_corpus(cfg, folder: Optional[Path | str] = None, save: bool = True) -> Corpus:
    """The corpus of the ``data`` section of ``cfg`` (a RunConfig), split as it says and read with its tokenizer (run, train workers,
    checkpoint eval, passkey). A BPE is the one kept in ``folder`` (the run's results folder), else trained on
    the train split and (``save``) kept there."""
    corpus = load_corpus(cfg.data.source, valid_fraction=cfg.data.valid_fraction,
                         test_fraction=cfg.data.test_fraction, text_field=cfg.data.text_field)
    tokenizer = load_tokenizer(cfg.data.tokenizer, lambda: [text for _, text in corpus.splits["train"]], folder, save)
    return corpus.with_tokenizer(tokenizer)
