"""What a cell's numbers depend on, as short hashes: reuse a checkpoint or a record only on a match.

- ``cell_key``: a trained model's weights (its own encoding's options, not every encoding's);
- ``finetune_key``: a fine-tuned model (the trained model's key, the row, its options, the resolved plan);
- ``model_key``: the model a row evaluates: its trained model's key, or its fine-tuned model's;
- ``eval_key``: the evaluation settings that change a row's numbers (and an eval-only row's own options, the
  eval-time options of an encoding that has them: ``+rand``'s eval positions, and with ``eval.tune`` the grid
  of each length a zero-shot row's options are chosen from: ``bench/eval/tune.py``);
- ``hf_eval_key``: everything a Hugging Face model's numbers depend on in ``eval``.

:class:`Keys` computes each key of a run once. Keys of rows without encoding options are the ones results
were made with before options were keyed per row, so those checkpoints stay reusable.

Every cell key holds the NUMERICS version (``NUMERICS``), never the package's release version: a release
that changes no number keeps every committed checkpoint and record reusable.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import Optional

from posenc_bench.bench.config import RunConfig
from posenc_bench.bench.eval import tune
from posenc_bench.bench.rows import Row

NUMERICS = 1
"""The version of the numbers: bump it by hand (2, 3, ...) in the change that makes the same config give
other numbers on purpose (the initialisation, the training loop, the data stream, an encoding's maths, how
a record is scored), and never otherwise: not for a release, a refactor, a new encoding, option or row (those
key themselves), a faster kernel that is tested equal to the old one. It is hashed into every ``cell_key``
(the key records are reused on too), so a bump retrains every model and re-measures every record: regenerate
the committed folders in the same change ("When numbers move" in docs/contributing.md)."""

# What a cell key hashes under "version" at each NUMERICS version. 1 is the release string every committed
# key was made with before there was a NUMERICS version, so those keys stay byte-for-byte what they were.
_HASHED = {1: "0.1.0"}


def hashed_numerics(numerics: int) -> str:
    """The value a cell key hashes for ``numerics``: "0.1.0" for 1 (the keys made before it existed), and
    "numerics <n>" for every later version, which no release string can equal."""
    return _HASHED.get(numerics, f"numerics {numerics}")


def ident_hash(ident: dict) -> str:
    """The 16-hex-digit hash every key here is: of ``ident`` as sorted JSON (what else keys a folder's work uses it
    too, e.g. ``needles``' unfinished rows)."""
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cell_key(cfg: RunConfig, trained: Row, seed: int, corpus_fingerprint: str) -> str:
    """Hash of everything that determines the weights of the trained row ``trained``.

    Includes the corpus fingerprint (the documents themselves, not just the source name), the precision and
    the numerics version (``NUMERICS``, not the release), so changed data or numbers never silently reuse an
    old checkpoint. Of the encoding
    options only the trained encoding's own: changing ``t5.num_buckets`` retrains t5, not rope; plus what the
    encoding resolves from them (``Encoding.key_options``, e.g. ``learned+rand``'s default position range),
    without those that only choose how it is evaluated (``eval_option_names``: ``+rand``'s eval positions).
    """
    name = trained.encoding
    model = asdict(cfg.model)
    if model.get("vocab_multiple") == 1:  # unpadded: the key every model had before the field existed
        del model["vocab_multiple"]
    model["encoding_options"] = {k: v for k, v in model["encoding_options"].items() if k == name}
    eval_only = trained.cls.eval_option_names  # e.g. +rand's eval_positions: not the weights'
    if any(k in eval_only for k in model["encoding_options"].get(name, {})):
        own = {k: v for k, v in model["encoding_options"][name].items() if k not in eval_only}
        model["encoding_options"] = {name: own} if own else {}
    ident = {
        "encoding": name,
        "window": trained.window,
        "seed": seed,
        "model": model,
        "train": train_ident(cfg),
        "data": data_ident(cfg),
        "corpus": corpus_fingerprint,
        "precision": cfg.precision,
        "version": hashed_numerics(NUMERICS),  # the key's name "version" kept: the hashed identity is unchanged
    }
    resolved = trained.cls.key_options(cfg.train.train_len, cfg.model.encoding_options.get(name, {}))
    if resolved:  # e.g. +rand's position range; absent for every other encoding, whose keys stay as they were
        ident["resolved_options"] = resolved
    return ident_hash(ident)


def train_ident(cfg: RunConfig) -> dict:
    """The train section as a key holds it: without ``compile`` (the same weights within float rounding) and
    ``divergence_patience`` (when a run is called diverged changes no finished model)."""
    train = asdict(cfg.train)
    del train["compile"], train["divergence_patience"]
    return train


def data_ident(cfg: RunConfig) -> dict:
    """The data section as a key holds it: without the tokenizer when it is bytes, the tokenizer every key
    was made with before there was a choice (its BPE's fingerprint is in the corpus fingerprint too)."""
    data = asdict(cfg.data)
    if data.get("tokenizer") == "bytes":
        del data["tokenizer"]
    return data


def finetune_key(base_key: str, cfg: RunConfig, row: Row) -> str:
    """Hash of what determines the model of the fine-tuned row ``row``: its trained model's key, the row's
    encoding, its own options, the resolved fine-tuning and the scaling factor it trains with (fine-tune
    length / train length, so that no checkpoint fine-tuned at another factor is reused)."""
    plan = cfg.finetune_plan()
    ident = {"base": base_key, "encoding": row.encoding, "options": cfg.model.encoding_options.get(row.encoding, {}),
             "finetune": asdict(plan), "factor": plan.len / cfg.train.train_len}
    return ident_hash(ident)


def model_key(cfg: RunConfig, row: Row, seed: int, corpus_fingerprint: str) -> str:
    """The key of the model ``row`` evaluates: its trained model's, or its fine-tuned model's for a -ft row."""
    key = cell_key(cfg, row.trained, seed, corpus_fingerprint)
    return finetune_key(key, cfg, row) if row.finetuned else key


def eval_key(cfg: RunConfig, row: Optional[Row] = None) -> str:
    """Hash of the evaluation settings that change a number (not the batch size); with ``row``, an eval-only
    row's own options (e.g. a fixed RoPE scaling factor) too."""
    # tune: per row, below; key_tokens: by Keys.eval, with the evaluator's model key, and only when on
    ident = {k: v for k, v in asdict(cfg.eval).items() if k not in ("batch_tokens", "tune", "key_tokens")}
    if ident["protocol"] == "nonoverlapping":  # the default protocol keeps the keys results were made with
        del ident["protocol"], ident["stride"]
    if ident.get("windows") == "stream":  # the default windows, too (documents: within single documents)
        del ident["windows"]
    ident["lengths"] = cfg.eval_lengths()
    ident["precision"] = cfg.precision
    if row is not None and row.cls.trained_as:
        own = cfg.model.encoding_options.get(row.encoding)
        if own:
            ident["variant_options"] = {row.encoding: own}
    evaluated = row_eval_options(cfg.model.encoding_options, row) if row is not None else {}
    if evaluated:  # e.g. +rand's random eval positions and their seed; absent where a row evaluates as before
        ident["eval_options"] = evaluated
    tuned = tune.grids(cfg, row) if row is not None else {}
    if tuned:  # eval.tune: the grid of each length, chosen on the valid split; absent where nothing is tuned
        ident["tuning"] = {"split": tune.SPLIT, "grids": tuned}
    return ident_hash(ident)


def row_eval_options(encoding_options: dict, row: Row) -> dict:
    """The eval-time options of ``row``'s encoding that make its numbers, resolved from ``encoding_options``
    (``model.encoding_options``; an eval-only row's merged over its trained encoding's, as it is built): {} for
    every encoding without any (``eval_options``), and for ``+rand`` evaluated at 0 .. L-1."""
    return row.cls.eval_options(tune.row_options(encoding_options, row))


def hf_eval_key(model: dict, *, train_len: int, lengths: list[int], corpus: str, eval_fingerprint: str,
                doc_sep: Optional[int], buckets: int, unit: int) -> str:
    """Hash of what a Hugging Face model's numbers depend on: its weights (``model``: the identity fields of
    ``HFModel.describe``), its train length, the eval lengths, the text and how it is cut and scored: the token
    before each document (``doc_sep``), and that it is context only, never a target (``separators``; the keys
    of records made while it was scored have no such field)."""
    ident = {"model": model, "train_len": train_len, "lengths": lengths, "corpus": corpus,
             "eval_fingerprint": eval_fingerprint, "doc_sep": doc_sep, "separators": "context", "buckets": buckets,
             "unit": unit}
    return ident_hash(ident)


def with_key_tokens(key: str, key_tokens: Optional[dict]) -> str:
    """An eval key extended by the key-token rule (``bench/eval/key_tokens.KeyTokenRule.describe``: the evaluator,
    alpha, beta, the short pass), so records whose LongPPL rests on another evaluator or rule never match; without
    key tokens (None) the key is unchanged, so every existing record stays reusable."""
    return key if key_tokens is None else ident_hash({"eval_key": key, "key_tokens": key_tokens})


def with_tuning(key: str, grids: dict, valid: Optional[dict]) -> str:
    """A pretrained model's row key extended by its ``eval --tune`` grids ({length: grid}) and the valid text they
    are chosen on (``pretrained._HFRows``), as ``grids`` extends a run's eval key: a tuned record never matches an
    untuned one, or the reverse; a row with nothing to tune ({}) keeps the key it always had."""
    return key if not grids else ident_hash({"eval_key": key, "tune": grids, "valid": valid})


class Keys:
    """The keys of one run's cells, each computed once: a sweep asks for them to resume, to estimate, to
    train and to write records."""

    def __init__(self, cfg: RunConfig, corpus_fingerprint: str) -> None:
        self.cfg, self.corpus_fingerprint = cfg, corpus_fingerprint
        self._models: dict[tuple[Row, int], str] = {}
        self._evals: dict[Row, str] = {}

    def model(self, row: Row, seed: int) -> str:
        """``model_key`` of the model ``row`` evaluates at ``seed``."""
        if (row, seed) not in self._models:
            self._models[row, seed] = model_key(self.cfg, row, seed, self.corpus_fingerprint)
        return self._models[row, seed]

    def eval(self, row: Row) -> str:
        """``eval_key`` of ``row``, with the key-token rule and its evaluator's model where eval.key_tokens is on."""
        if row not in self._evals:
            self._evals[row] = with_key_tokens(eval_key(self.cfg, row), self.key_tokens())
        return self._evals[row]

    def key_tokens(self) -> Optional[dict]:
        """What the key tokens of this run depend on (None when off): the rule, and the evaluator's model key."""
        kt = self.cfg.eval.key_tokens
        if not kt.evaluator:
            return None
        row, seed = self.cfg.row(kt.evaluator), self.cfg.seeds[0] if kt.seed is None else kt.seed
        return {**kt.rule().describe(self.cfg.train.train_len), "evaluator": row.name, "seed": seed,
                "evaluator_model": self.model(row, seed)}

    def cell(self, row: Row, seed: int) -> dict:
        """The keys a cell's records carry: ``cell_key`` (its model) and ``eval_key``."""
        return {"cell_key": self.model(row, seed), "eval_key": self.eval(row)}
