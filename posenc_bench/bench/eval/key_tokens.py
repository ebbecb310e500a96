"""Key tokens (Fang et al., ICLR 2025, "What is Wrong with Perplexity for Long-context Language Modeling?"):
the targets of each eval length whose prediction needs the long context, the ones LongPPL scores.

A target is a **key token** at eval length E when, under one named **evaluator** model (the same for every row
of a table),

    nll_short - nll_long > alpha   and   -nll_long > beta      (alpha = 2, beta = -2 nats: the paper's)

where ``nll_long`` is the evaluator's NLL of the target with its context in the window of E tokens that scores
it (``evaluate.py``'s non-overlapping windows: the context rows are scored with) and ``nll_short`` its NLL with
only the last tokens of that context: about the train length L_train. These are the authors' rule and
thresholds (``longppl`` 0.3.0, ``longppl/longppl.py``, ``find_key_token``: ``(loss_short - loss_full) >
alpha`` and ``loss_full < -beta``). Only a target whose long context is longer than L_train tokens and longer
than its short one can be key (``candidates``), so **at E = L_train there are no key tokens**: LongPPL is not
computed at 1x.

The short context. Scoring every target with exactly its last L_train tokens takes one forward per target, so,
as the package does, windows of the short pass share their context (``evaluate.windows`` with a stride k, its
strided protocol):

- ``train`` (ours, the default): windows of L_train tokens, stride k: each target after the first window is
  scored with between L_train - k + 1 and L_train tokens of context, never more than the evaluator was trained
  on, so the short NLL is in the evaluator's own range;
- ``longppl`` (the package's): windows of L_train + k - 1 tokens, stride k: between L_train and L_train + k - 1
  tokens (``find_key_token``'s ``trunc_len`` = L_train and ``sliding_window`` = k: its short inputs are
  ``input_ids[start : start + trunc_len + sliding_window]``, scoring the last ``sliding_window``). The package's
  last window is cut short where the text ends; ``evaluate.windows`` moves it back to full length instead, so
  the two agree exactly when (tokens - trunc_len) is a multiple of k.

Where the evaluator is: for ``posenc-bench eval`` a row of the same eval (``pretrained.py``, ``--key-tokens``);
for a run, ``eval.key_tokens`` names a row of the run (and a seed), whose model the sweep gets (trained if need
be) and scores before any row (``model_nll_at``). Either way the key tokens are kept in the folder
(``KeyTokenFile``, ``KEY_TOKENS_FILE``, under a hash of the rule, the evaluator's model key and the text), pass
by pass; each row's evaluation then sums its NLL over them per unit (``evaluate.EvalSet.key_tokens``,
``evaluate.Targets.key``).

The package's long context is the whole text in one forward (``find_key_token``'s ``output_full``,
``compute_longppl``'s ``output_full``); ours is the window of E tokens, so at E = the text's length the two are
the same computation (``tests/bench/eval/test_key_tokens.py`` checks the key set and LongPPL against
``compute_longppl``).

Every function here is pure but ``target_nll`` and ``model_nll_at``, which run a model over windows;
``KeyTokenFile`` reads and writes the folder's file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import torch

from posenc_bench.bench.eval.evaluate import logits_nll, window_ids, windows
from posenc_bench.errors import ConfigError, PosencError
from posenc_bench.files import atomic_write

ALPHA = 2.0  # nats: the least drop of the NLL with the long context (the paper's and the package's alpha)
BETA = -2.0  # the least long-context log-probability (the package's beta)
SHORT_CONTEXTS = ("train", "longppl")  # what the short pass's windows are: see the module docstring
KEY_TOKENS_FILE = "key_tokens.pt"  # a folder's key tokens: {"hash", "ident", "short", "masks": {length: (N, S + 1)}}


@dataclass(frozen=True)
class KeyTokenRule:
    """How key tokens are identified: the evaluator (a row name), the thresholds, and the short pass (its
    protocol and stride; stride None: a quarter of the train length, the package's ratio of its defaults,
    ``sliding_window`` 1024 to ``trunc_len`` 4096)."""

    evaluator: str
    alpha: float = ALPHA
    beta: float = BETA
    short_context: str = "train"
    stride: Optional[int] = None

    def __post_init__(self) -> None:
        if self.short_context not in SHORT_CONTEXTS:
            raise ConfigError(f"key tokens: short_context {self.short_context!r} is not one; valid: "
                              f"{', '.join(SHORT_CONTEXTS)}")
        if self.stride is not None and self.stride < 1:
            raise ConfigError(f"key tokens: stride must be >= 1 token, got {self.stride}")
        if not self.evaluator:
            raise ConfigError("key tokens: name the evaluator (a row whose model identifies them)")

    def named(self, rows: dict[str, str]) -> "KeyTokenRule":
        """This rule with its evaluator as a row's name; ``rows``: each name the evaluator may be given (a scaling's
        suffix, "model") -> its row. A row's own name is one too; ConfigError naming the valid names else."""
        rows = {**rows, **{row: row for row in rows.values()}}
        if self.evaluator not in rows:
            raise ConfigError(f"key tokens: the evaluator {self.evaluator!r} is not a row of this eval; valid: "
                              f"{', '.join(rows)}")
        return replace(self, evaluator=rows[self.evaluator])

    def short_windows(self, train_len: int) -> tuple[int, int]:
        """(window length, stride) of the short pass for a model trained at ``train_len`` tokens."""
        k = self.stride or max(1, train_len // 4)
        if self.short_context == "longppl":
            return train_len + k - 1, k
        return train_len, min(k, train_len)

    def describe(self, train_len: int) -> dict:
        """What a run records of the rule, and what its eval key hashes (``keys.with_key_tokens``)."""
        length, stride = self.short_windows(train_len)
        return {**asdict(self), "short_window": length, "short_stride": stride, "train_len": train_len}


def target_nll(nll_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], segments: torch.Tensor, length: int,
               stride: Optional[int] = None, *, batch_tokens: int = 16384, device: torch.device | str = "cpu",
               on_windows: Optional[Callable[[Optional[torch.Tensor]], None]] = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(nll, context), each (N, S): every target's NLL (float64) under ``nll_fn(inputs, targets) -> (b, l)`` and
    the tokens of context it was scored with, over ``evaluate.windows(segments, length, stride)`` (each target
    once; ``segments`` (N, S + 1)); ``on_windows`` as ``evaluate.score_windows``'s (our encodings hear each
    window's index, so a ``+rand`` evaluator draws the positions its row is scored with)."""
    N, S = segments.shape[0], segments.shape[1] - 1
    nll = torch.full((N, S), float("nan"), dtype=torch.float64)
    context = torch.zeros((N, S), dtype=torch.int64)
    rows = max(1, batch_tokens // length)
    scored = 0  # targets of each segment scored so far: windows come in order
    with torch.inference_mode():
        for inputs, targets, first in windows(segments, length, stride):
            l = inputs.shape[1]
            cols = slice(scored, scored + l - first)
            for i in range(0, N, rows):
                x, y = inputs[i : i + rows].to(device), targets[i : i + rows]
                if on_windows is not None:
                    on_windows(window_ids(slice(i, i + y.shape[0]), scored - first, segments.shape[1]))
                try:
                    nll[i : i + rows, cols] = nll_fn(x, y).double().cpu()[:, first:]
                finally:
                    if on_windows is not None:
                        on_windows(None)
            context[:, cols] = torch.arange(first + 1, l + 1)  # column c of a window has c + 1 tokens of context
            scored += l - first
    return nll, context


def candidates(long_context: torch.Tensor, short_context: torch.Tensor, train_len: int) -> torch.Tensor:
    """(N, S) bool: targets that can be key: their long context is longer than ``train_len`` tokens and than
    their short one (so the short context is the last part of the long one: both end at the target). None at
    E = ``train_len``, where no long context is longer than the train length."""
    return (long_context > train_len) & (short_context < long_context)


def key_mask(nll_long: torch.Tensor, nll_short: torch.Tensor, alpha: float = ALPHA, beta: float = BETA,
             eligible: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(…) bool: the key tokens, ``find_key_token``'s rule: nll_short - nll_long > alpha and -nll_long > beta
    (strict, as the package's), among the ``eligible`` targets (``candidates``; None: all). Same shape in."""
    key = (nll_short - nll_long > alpha) & (-nll_long > beta)
    return key if eligible is None else key & eligible


def as_segments(mask: torch.Tensor) -> torch.Tensor:
    """A (N, S) mask over the targets as (N, S + 1) over the segments' tokens (``evaluate.Targets.key``): a
    token is key where it is predicted; the leading token of a segment is context only."""
    return torch.cat([torch.zeros_like(mask[:, :1]), mask], 1)


class KeyTokenFile:
    """The key tokens kept for one ``ident`` (what they depend on: the rule, the evaluator's model key, the text)
    in a folder's file (``KEY_TOKENS_FILE``; ``path`` None: kept in memory only): the short pass's (nll, context)
    and the mask at each length, each written atomically as it is found. A rerun, a shard or a resumed run takes
    them without the evaluator's passes again, an interrupted evaluation resumes at its next pass (on a CPU one
    pass of a pretrained model at 4x its context takes many minutes), and a changed evaluator, rule or text
    (another hash) never reuses them: it starts the file afresh."""

    def __init__(self, path: Optional[Path | str], ident: dict, read: bool = True) -> None:
        self.path = None if path is None else Path(path)
        self.ident = json.dumps(ident, sort_keys=True, default=str)
        self.digest = hashlib.sha256(self.ident.encode()).hexdigest()[:16]
        self.short: Optional[tuple[torch.Tensor, torch.Tensor]] = None
        self.masks: dict[int, torch.Tensor] = {}
        saved = self._read() if read else {}  # read False: start afresh (the file is replaced at the first save)
        if saved.get("hash") == self.digest:
            self.short, self.masks = saved.get("short"), dict(saved["masks"])

    def _read(self) -> dict:
        if self.path is None or not self.path.exists():
            return {}
        try:
            saved = torch.load(self.path, weights_only=True)
        except Exception as e:  # torch raises several kinds on a damaged file
            saved = e
        if not (isinstance(saved, dict) and isinstance(saved.get("masks"), dict)):
            raise PosencError(f"{self.path}: not a key-token file ({str(saved)[:80]}); it holds only the evaluator's "
                               "passes: delete it to compute them afresh")
        return saved

    def save(self) -> None:
        if self.path is not None:
            atomic_write(self.path, lambda tmp: torch.save({"hash": self.digest, "ident": self.ident,
                                                            "short": self.short, "masks": self.masks}, tmp))


class KeyTokens:
    """The key tokens of one text at each eval length under one evaluator, computed on first need: the short
    pass once (it is the same at every length), a long pass per length, each kept in ``store`` (None: in memory
    only). ``nll_at(length, stride)`` gives the evaluator's ``target_nll`` with windows of ``length`` (its rows'
    scoring: non-overlapping, stride None)."""

    def __init__(self, rule: KeyTokenRule, train_len: int, nll_at: Callable[[int, Optional[int]], tuple],
                 target_mask: Optional[torch.Tensor] = None, store: Optional[KeyTokenFile] = None) -> None:
        self.rule, self.train_len, self.nll_at = rule, train_len, nll_at
        self.target_mask = target_mask  # (N, S + 1) bool or None: context-only tokens are never key
        self.store = store or KeyTokenFile(None, {})

    def at(self, length: int) -> Optional[torch.Tensor]:
        """(N, S + 1) bool: the key tokens at eval length ``length``; None at or below the train length, where
        there are none (its records carry no key-token fields: LongPPL is not computed at 1x)."""
        if length <= self.train_len:
            return None
        store = self.store
        if length not in store.masks:
            if store.short is None:
                store.short = self.nll_at(*self.rule.short_windows(self.train_len))
                store.save()
            nll_short, ctx_short = store.short
            nll_long, ctx_long = self.nll_at(length, None)
            mask = as_segments(key_mask(nll_long, nll_short, self.rule.alpha, self.rule.beta,
                                        candidates(ctx_long, ctx_short, self.train_len)))
            store.masks[length] = mask if self.target_mask is None else mask & self.target_mask.bool()
            store.save()
        return store.masks[length]


def model_nll_at(model, evalset, rt) -> Callable[[int, Optional[int]], tuple[torch.Tensor, torch.Tensor]]:
    """``KeyTokens``'s ``nll_at`` for one of our models on a run's eval set (``evaluate.EvalSet``; ``rt``: a
    bench.run.runtime.Runtime): ``target_nll`` with the encoding set for each length, as ``evaluate_model``
    scores it."""

    def nll_at(length: int, stride: Optional[int]) -> tuple[torch.Tensor, torch.Tensor]:
        model.encoding.set_eval_length(length)
        model.eval()
        with rt.autocast_context():
            return target_nll(logits_nll(model), evalset.segments, length, stride, device=rt.device,
                              batch_tokens=evalset.scoring.batch_tokens, on_windows=model.encoding.set_eval_windows)

    return nll_at


def of_model(rule: KeyTokenRule, model, evalset, rt, train_len: int, store: Optional[KeyTokenFile] = None) -> dict:
    """{length: (N, S + 1) bool} the key tokens at every length of ``evalset`` past ``train_len``, with one of our
    models as the evaluator (``model_nll_at``), kept in ``store`` as each pass ends."""
    keys = KeyTokens(rule, train_len, model_nll_at(model, evalset, rt), store=store)
    return {L: keys.at(L) for L in evalset.lengths if L > train_len}
