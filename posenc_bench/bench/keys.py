"""What a cell's numbers depend on, as short hashes: reuse a checkpoint or a record only on a match.

- ``cell_key``: a trained model's weights (its own encoding's options, not every encoding's);
- ``finetune_key``: a fine-tuned model (the trained model's key, the row, its options, the resolved plan);
- ``eval_key``: the evaluation settings that change a row's numbers (and an eval-only row's own options).

Keys of rows without encoding options are the ones results were made with before options were keyed per
row, so those checkpoints stay reusable.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import Optional

from posenc_bench import encodings
from posenc_bench.bench.config import RunConfig


def _hash(ident: dict) -> str:
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def cell_key(cfg: RunConfig, trained_encoding: str, window: Optional[int], seed: int, corpus_fingerprint: str) -> str:
    """Hash of everything that determines a trained model's weights.

    Includes the corpus fingerprint (the documents themselves, not just the source name), the precision and
    the package version, so changed data or code never silently reuses an old checkpoint. Of the encoding
    options only the trained encoding's own: changing ``t5.num_buckets`` retrains t5, not rope; plus what the
    encoding resolves from them (``Encoding.key_options``, e.g. ``learned+rand``'s default position range).
    """
    from posenc_bench import __version__

    model = asdict(cfg.model)
    model["encoding_options"] = {k: v for k, v in model["encoding_options"].items() if k == trained_encoding}
    ident = {
        "encoding": trained_encoding,
        "window": window,
        "seed": seed,
        "model": model,
        "train": asdict(cfg.train),
        "data": asdict(cfg.data),
        "corpus": corpus_fingerprint,
        "precision": cfg.precision,
        "version": __version__,
    }
    resolved = encodings.get_class(trained_encoding).key_options(
        cfg.train.train_len, cfg.model.encoding_options.get(trained_encoding, {}))
    if resolved:  # e.g. +rand's position range; absent for every other encoding, whose keys stay as they were
        ident["resolved_options"] = resolved
    return _hash(ident)


def finetune_key(base_key: str, cfg: RunConfig, encoding: str) -> str:
    """Hash of what determines a fine-tuned model: the trained model's key, the row, its own options, the
    resolved fine-tuning and the scaling factor it trains with (fine-tune length / train length: before that
    rule, rope-dynamic-ft trained with its zero-shot default factor 2, and such checkpoints must not be reused)."""
    plan = cfg.finetune_plan()
    ident = {"base": base_key, "encoding": encoding, "options": cfg.model.encoding_options.get(encoding, {}),
             "finetune": asdict(plan), "factor": plan.len / cfg.train.train_len}
    return _hash(ident)


def row_cell_key(cfg: RunConfig, name: str, window: Optional[int], seed: int, corpus_fingerprint: str) -> str:
    """The key of the model a row evaluates: its trained model's, or its fine-tuned model's for a -ft row."""
    cls = encodings.get_class(name)
    key = cell_key(cfg, cls.trained_as or name, window, seed, corpus_fingerprint)
    return finetune_key(key, cfg, name) if cls.finetuned else key


def eval_key(cfg: RunConfig, encoding: Optional[str] = None) -> str:
    """Hash of the evaluation settings that change a number (not the batch size); with ``encoding``, an
    eval-only variant's own options (e.g. a fixed RoPE scaling factor) too."""
    ident = {k: v for k, v in asdict(cfg.eval).items() if k != "batch_tokens"}
    if ident["protocol"] == "nonoverlapping":  # the default protocol keeps the keys results were made with
        del ident["protocol"], ident["stride"]
    ident["lengths"] = cfg.eval_lengths()
    ident["precision"] = cfg.precision
    if encoding is not None and encodings.get_class(encoding).trained_as:
        own = cfg.model.encoding_options.get(encoding)
        if own:
            ident["variant_options"] = {encoding: own}
    return _hash(ident)
