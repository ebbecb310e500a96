"""What a sweep trains on and scores: text (a corpus and its eval segments) or a task (``bench/tasks``).

A sweep asks its work for the train batches of a seed, the eval lengths, the evaluation of one model at one
length and what the run's metadata records of the data; it never asks which kind it has. :func:`for_run`
picks the kind from the config (``task.name``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

import torch

from posenc_bench.bench.config import RunConfig, load_run_corpus
from posenc_bench.bench.eval.evaluate import EvalSet, evaluate_model
from posenc_bench.data import Corpus, TrainBatches, tokens_fingerprint
from posenc_bench.errors import DataError
from posenc_bench.tokenizer import keep_tokenizer


class TextWork:
    """A text run: the corpus read with its tokenizer, the same eval targets at every length (``EvalSet``)."""

    metric = "ppl"
    counted = "target tokens each"  # what the run's eval_tokens counts, for the sweep's summary

    def __init__(self, cfg: RunConfig, out: Optional[Path | str], save: bool = False) -> None:
        self.cfg = cfg
        self.corpus: Corpus = load_run_corpus(cfg, out, save=save)  # a BPE kept in the folder, or trained here
        self.evalset = EvalSet.for_run(cfg, self.corpus)
        self.lengths, self.train_len, self.fingerprint = self.evalset.lengths, cfg.train.train_len, self.corpus.fingerprint
        self._stream: Optional[torch.Tensor] = None
        self._valid: Optional[EvalSet] = None
        check_train_split(cfg, self.corpus)

    def batches(self, seed: int) -> TrainBatches:
        if self._stream is None:
            self._stream = self.corpus.stream("train")
        return TrainBatches(self._stream, self.cfg.train.train_len, self.cfg.train.batch_size, seed)

    def evaluate(self, model, length: int, rt, valid: bool = False) -> dict:
        """The numbers of ``model`` at ``length`` on the run's eval set (``valid``: the valid split's, cut alike)."""
        return evaluate_model(model, self.valid() if valid else self.evalset, length, rt)

    def valid(self) -> EvalSet:
        """The valid split cut as the eval set is (its tokens, windows, protocol), built once: what ``eval.tune``
        chooses on (``bench/eval/tune.py``)."""
        if self._valid is None:
            self._valid = EvalSet.for_run(replace(self.cfg, eval=replace(self.cfg.eval, split="valid")), self.corpus)
        return self._valid

    def valid_meta(self) -> dict:
        """What a tuned record says of the text its choice was made on: split, targets, fingerprint."""
        v = self.valid()
        tok = (v.tokenizer or {}).get("fingerprint")
        return {"split": "valid", "targets": int(v.segments.shape[0] * (v.segments.shape[1] - 1)),
                "fingerprint": tokens_fingerprint(v.segments, tok)}

    def meta(self) -> dict:
        """What a run's metadata records of the text: the corpus, the eval segments, the documents scored."""
        return {"segments": self.evalset.segments, "corpus": self.corpus.describe(), **self.evalset.meta()}

    def describe(self) -> str:
        return f"corpus {self.corpus.source} ({self.corpus.fingerprint}, {self.cfg.eval.split} split)"

    def tokenizer(self) -> Optional[dict]:
        """A BPE's description for checkpoint metas (None for bytes)."""
        tok = self.corpus.tokenizer
        return tok.describe() if tok.fingerprint else None

    def keep(self, folder: Path | str) -> None:
        """Write a BPE into the results folder (resume, shards and checkpoint evals load it from there)."""
        keep_tokenizer(folder, self.corpus.tokenizer)


def check_train_split(cfg: RunConfig, corpus: Corpus) -> None:
    """DataError now, before any work, when the train split cannot fill one training (or fine-tuning) window."""
    docs = corpus.splits["train"]
    tokens = sum(t.numel() for _, t in corpus.document_tokens("train")) if docs else 0  # the stream's length
    needs = [cfg.train.train_len]
    if any(row.finetuned for row in cfg.rows()):
        needs.append(cfg.finetune_plan().len)
    if not docs or tokens < max(needs) + 2:
        raise DataError(f"corpus {corpus.source!r}: its train split has {tokens} tokens ({len(docs)} documents), "
                        f"fewer than {max(needs) + 2} (train length + 2); give a larger --data or a shorter length")


def for_run(cfg: RunConfig, out: Optional[Path | str] = None, save: bool = False):
    """The work of a run: a task's (``task.name``) or the text's."""
    if cfg.task.name:
        from posenc_bench.bench.tasks.work import TaskWork

        return TaskWork(cfg)
    return TextWork(cfg, out, save)
