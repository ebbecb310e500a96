"""The document of each resampling unit, for results made before units recorded it (``posenc-bench documents``).

A text record's units name their documents since ``evaluate.unit_documents`` exists (``units["doc"]``: the place,
in the run's ``eval_documents``, of the document that holds most of each unit's targets). A results folder made
before has none, and some have no ``eval_documents`` either. :func:`backfill` gives them both, without
evaluating anything:

1. the eval text is rebuilt from the run's own metadata: our models' from the run's config (corpus, split,
   tokenizer, windows, lengths, eval tokens: ``EvalSet.for_run``, as the run built it); a Hugging Face model's
   through its tokenizer alone (no weights, no forward: ``pretrained.hf_text``, with the separator the run
   recorded). results/smollm2 and timing-gpu/smollm2 got theirs this way, rebuilt rather than derived from
   their metadata (whose ``eval_documents`` was only a count, 1);
2. the rebuilt text must be the records': its eval fingerprint the run's ``eval_fingerprint``, its unit size
   and count the records', its documents the run's ``eval_documents`` where it has them; else
   ``DocumentsError`` ("rebuilt eval text differs from the records': ...") and nothing is written;
3. each text record's ``units`` gains ``doc`` and the run ``eval_documents`` (name -> targets) where it has
   none, or only their count (Hugging Face evals made before it listed them); every other value stays as it
   was (checked before writing), written atomically under the folder's writer lock.

Where the text cannot be rebuilt on this machine (a ``stdlib`` corpus of another Python), ``from_metadata``
derives the same documents from the run's ``eval_documents`` instead, with no text to check them against: it
lists the documents in scoring order with the targets of each, and the segments' targets are scored in that
order (the stream's targets in order; with document-bounded windows, each document's segments together).
A folder whose text records all have documents is left alone; a task's records need none (each unit is one
test instance, not a block of text).
"""

from __future__ import annotations

import copy
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from posenc_bench.bench.eval.evaluate import EvalSet, unit_documents
from posenc_bench.bench.records import ResultsError, ResultsFolder, read_results
from posenc_bench.files import atomic_write_json

TEXT = "ppl"  # the metric of text records (records written before the field existed are text records)


class DocumentsError(ResultsError):
    """A folder whose units cannot be given their documents: its text rebuilt here differs from the records',
    or the run does not say how to rebuild it."""


@dataclass
class Rebuilt:
    """A run's eval text as far as units need it: each target's document and the documents' names."""

    documents: dict  # name -> targets it holds, in scoring order (the run's eval_documents)
    target_docs: torch.Tensor  # (N, S) the document of each target: its place in ``documents``
    unit: int  # the run's resampling unit, in targets
    how: str  # how it was made, in words


@dataclass
class Backfill:
    """What :func:`backfill` did to one folder."""

    path: Path  # the results file
    outcome: str  # "written", "already" (every unit had its document) or "task" (nothing to do)
    records: int = 0  # text records given their units' documents
    documents: int = 0  # documents of the eval text
    how: str = ""

    def line(self) -> str:
        """One line for the command to print."""
        if self.outcome == "task":
            return f"{self.path}: nothing to do: task records (each unit is one test instance, not a block of text)"
        if self.outcome == "already":
            return f"{self.path}: left alone: every text record's units already name their documents"
        return (f"{self.path}: wrote the documents of the units of {self.records} text record(s) "
                f"({self.documents} document(s); {self.how})")


def text_records(data: dict) -> list[dict]:
    """The records of ``data`` with per-unit numbers of text (not a task's instances)."""
    return [r for r in data["records"] if (r.get("metric") or TEXT) == TEXT and r.get("units")]


def backfill(folder: Path | str, *, model: Optional[str] = None, from_metadata: bool = False) -> Backfill:
    """Give every text record of the results in ``folder`` (a folder or its results file) its units'
    documents, and the run its ``eval_documents`` (see the module docstring). ``model``: where a Hugging Face
    eval's model is when the one it recorded is not on this machine (``hf:<folder or .gguf>``)."""
    path = Path(folder)
    path = path / "results.json" if path.is_dir() or not path.suffix else path
    nothing = _nothing_to_do(path, read_results(path))  # a folder with nothing to do is not even locked
    if nothing is not None:
        return nothing
    with ResultsFolder(path.parent, path.name):
        data = read_results(path)  # again, under the lock: what another writer may have changed meanwhile
        nothing = _nothing_to_do(path, data)
        if nothing is not None:
            return nothing
        rebuilt = from_run_metadata(data["run"]) if from_metadata else rebuild(data["run"], path.parent, model)
        new = with_documents(data, rebuilt, path)
        atomic_write_json(path, new)
        return Backfill(path, "written", len(text_records(data)), len(rebuilt.documents), rebuilt.how)


def _nothing_to_do(path: Path, data: dict) -> Optional[Backfill]:
    """The outcome of a folder whose units need no documents (a task's) or have them all; None otherwise.
    DocumentsError for records made before there were per-unit numbers at all."""
    texts = text_records(data)
    if not texts:
        if any(r.get("units") for r in data["records"]):
            return Backfill(path, "task")
        raise DocumentsError(f"{path} has no record with per-unit numbers (made before units existed): nothing to "
                             "give documents to")
    if all("doc" in r["units"] for r in texts) and isinstance(data["run"].get("eval_documents"), dict):
        return Backfill(path, "already")
    return None


def with_documents(data: dict, rebuilt: Rebuilt, path: Path) -> dict:
    """A copy of ``data`` with the documents of every text record's units and the run's ``eval_documents``;
    DocumentsError where the records do not fit the rebuilt text. Every other value is checked unchanged."""
    recorded = data["run"].get("eval_documents")
    if isinstance(recorded, dict) and recorded != rebuilt.documents:
        raise DocumentsError(f"rebuilt eval text differs from the records': its documents are not the run's "
                             f"eval_documents in {path} ({_first_difference(recorded, rebuilt.documents)})")
    if isinstance(recorded, int) and recorded != len(rebuilt.documents):
        raise DocumentsError(f"rebuilt eval text differs from the records': {len(rebuilt.documents)} documents, "
                             f"{recorded} in the run's eval_documents in {path}")
    new = copy.deepcopy(data)
    docs = unit_documents(rebuilt.target_docs, rebuilt.unit)
    for rec in text_records(new):
        units, where = rec["units"], f"{rec['encoding']} at {rec['eval_len']} in {path}"
        if units.get("size") != rebuilt.unit:
            raise DocumentsError(f"rebuilt eval text differs from the records': units of {units.get('size')} "
                                 f"targets in {where}, {rebuilt.unit} in the run")
        if len(units["nll"]) != len(docs):
            raise DocumentsError(f"rebuilt eval text differs from the records': {len(docs)} units of "
                                 f"{rebuilt.unit} targets, {len(units['nll'])} in {where}")
        if "doc" in units and units["doc"] != docs:
            raise DocumentsError(f"rebuilt eval text differs from the records': {where} names other documents "
                                 "for its units")
        units["doc"] = list(docs)
    new["run"]["eval_documents"] = dict(rebuilt.documents)
    if without_documents(new) != without_documents(data):  # the promise: nothing else moved
        raise AssertionError(f"giving {path} its documents changed another value")
    return new


def without_documents(data: dict) -> dict:
    """``data`` without what :func:`backfill` writes (units' ``doc``, the run's ``eval_documents``): what it
    must leave exactly as it was."""
    out = copy.deepcopy(data)
    out["run"].pop("eval_documents", None)
    for rec in out["records"]:
        if isinstance(rec.get("units"), dict):
            rec["units"].pop("doc", None)
    return out


def _first_difference(recorded: dict, rebuilt: dict) -> str:
    """The first document (in scoring order) where two ``eval_documents`` differ, in words."""
    there, here = list(recorded.items()), list(rebuilt.items())
    at = next((i for i, (a, b) in enumerate(zip(there, here)) if a != b), min(len(there), len(here)))
    shown = [f"{side[at][0]!r} ({side[at][1]} targets) {where}" if at < len(side) else f"no document {where}"
             for side, where in ((there, "there"), (here, "here"))]
    return f"document {at + 1}: {shown[0]}, {shown[1]}"


# ---- the eval text, rebuilt -------------------------------------------------------------------------------

def rebuild(run: dict, folder: Path, model: Optional[str] = None) -> Rebuilt:
    """The run's eval text rebuilt from its metadata (a Hugging Face eval's through its tokenizer, else from its
    config), checked against the records' ``eval_fingerprint``."""
    described = run.get("model") if isinstance(run.get("model"), dict) else {}
    if described.get("kind") == "hf":
        text, fingerprint, how = _hf_rebuild(run, model)
    else:
        text, fingerprint, how = _our_rebuild(run, folder)
    want = run.get("eval_fingerprint")
    if fingerprint != want:
        corpus = text["corpus"]
        python = (f"; the stdlib of Python {platform.python_version()} here, "
                  f"{run.get('versions', {}).get('python')} there" if corpus["source"] == "stdlib" else "")
        hint = (", or derive the documents from the run's eval_documents with --from-metadata"
                if isinstance(run.get("eval_documents"), dict) else "")
        raise DocumentsError(
            f"rebuilt eval text differs from the records': eval fingerprint {fingerprint} here, {want} in "
            f"{folder} (corpus {corpus['source']!r}: fingerprint {corpus['fingerprint']} here, "
            f"{run.get('corpus', {}).get('fingerprint')} there{python}); rebuild it where the run was made{hint}")
    return Rebuilt(text["documents"], text["target_docs"], text["unit"], how)


def _our_rebuild(run: dict, folder: Path) -> tuple[dict, str, str]:
    """Our model's eval text (a run's or a checkpoint eval's): ``EvalSet.for_run`` of the run's config."""
    from posenc_bench.bench.config import config_from_dict, load_run_corpus
    from posenc_bench.data import tokens_fingerprint

    if "config" not in run:
        raise DocumentsError(f"{folder}: the run records no config to rebuild its eval text from")
    cfg = config_from_dict(run["config"])
    corpus = load_run_corpus(cfg, _tokenizer_folder(cfg, run, folder), save=False)
    evalset = EvalSet.for_run(cfg, corpus)
    fingerprint = tokens_fingerprint(evalset.segments, (evalset.tokenizer or {}).get("fingerprint"))
    text = {"documents": evalset.documents, "target_docs": evalset.target_docs, "corpus": corpus.describe(),
            "unit": evalset.scoring.unit}
    return text, fingerprint, f"rebuilt from the run's config ({cfg.eval.windows} windows), fingerprint checked"


def _tokenizer_folder(cfg, run: dict, folder: Path) -> Optional[Path]:
    """Where the run's BPE is kept: its own folder, or (a checkpoint's eval) the run folder of the checkpoint;
    DocumentsError where neither has it (a BPE trained again here could differ). None for bytes."""
    from posenc_bench.tokenizer import file_name, parse_tokenizer

    if parse_tokenizer(cfg.data.tokenizer) is None:
        return None
    described = run.get("model") if isinstance(run.get("model"), dict) else {}
    places = [folder] + ([Path(described["path"]).parent.parent] if described.get("kind") == "checkpoint" else [])
    for place in places:
        if (place / file_name(cfg.data.tokenizer)).is_file():
            return place
    raise DocumentsError(f"the run's tokenizer {cfg.data.tokenizer} ({file_name(cfg.data.tokenizer)}) is in none "
                         f"of {', '.join(str(p) for p in places)}; copy it into {folder}")


def _hf_rebuild(run: dict, model: Optional[str]) -> tuple[dict, str, str]:
    """A Hugging Face eval's text through the model's tokenizer (no weights), cut as the run recorded: its
    corpus, split, eval tokens, segment length, --long-docs and the separator it put between documents."""
    from posenc_bench.bench.eval.hf_text import hf_text
    from posenc_bench.data import load_corpus, tokens_fingerprint
    from posenc_bench.hf.model import ModelSpec, load_tokenizer, resolve_model
    from posenc_bench.hf.tokenize import recorded_separator

    described, cfg = run["model"], run.get("config", {})
    if model is not None:
        spec = resolve_model(model)
        if spec.kind != "hf":
            raise DocumentsError(f"--model {model!r}: a Hugging Face eval's model is hf:<folder | hub name | .gguf>")
    else:
        if not described.get("ref"):
            raise DocumentsError("the eval records no model (run.model.ref) whose tokenizer rebuilds its text; give "
                                 "--model hf:<its folder or .gguf file>")
        spec = ModelSpec("hf", described["ref"], described.get("model", ""), gguf_file=described.get("gguf_file"))
        where = Path(spec.ref) / (spec.gguf_file or "")
        if spec.ref.startswith(("/", ".", "~")) and not where.exists():
            raise DocumentsError(f"the model this eval recorded is not on this machine ({where}); give --model "
                                 "hf:<its folder or .gguf file>")
    corpus = load_corpus(cfg.get("data", {}).get("source", "stdlib"))
    evaluation = cfg.get("eval", {})
    text = hf_text(load_tokenizer(spec), corpus, run["segment_len"], evaluation.get("tokens", run["eval_tokens"]),
                   split=evaluation.get("split", "test"), long_docs=bool(evaluation.get("long_docs")),
                   doc_sep=recorded_separator(run.get("doc_separator", "none")))
    rebuilt = {"documents": text.documents, "target_docs": text.target_docs, "corpus": corpus.describe(),
               "unit": evaluation.get("unit") or max(run["eval_lengths"])}
    how = (f"rebuilt through the tokenizer of {spec.gguf_file or spec.ref} (separator "
           f"{run.get('doc_separator')}), fingerprint checked")
    return rebuilt, tokens_fingerprint(text.segments), how


# ---- from the run's eval_documents ------------------------------------------------------------------------

def from_run_metadata(run: dict) -> Rebuilt:
    """The documents of the eval text from the run's ``eval_documents`` alone (name -> targets, in scoring
    order), where the text cannot be rebuilt here: target t of the segments (flattened in scoring order)
    belongs to the document whose running total of targets first exceeds t. Checked: the documents hold the
    run's eval tokens exactly, in whole segments; there is no text to check them against."""
    documents = run.get("eval_documents")
    if not isinstance(documents, dict) or not documents:
        raise DocumentsError("--from-metadata needs the run's eval_documents (name -> targets of each document); "
                             f"this run records {documents!r}: rebuild its text instead (without --from-metadata)")
    S, total = run.get("segment_len"), run.get("eval_tokens")
    if not S or sum(documents.values()) != total or total % S:
        raise DocumentsError(f"the run's eval_documents hold {sum(documents.values())} targets, not its eval tokens "
                             f"({total}) in segments of {S}: they cannot say where each target is")
    counts = torch.tensor(list(documents.values()))
    target_docs = torch.repeat_interleave(torch.arange(len(documents)), counts).view(-1, S)
    unit = run.get("config", {}).get("eval", {}).get("unit") or max(run["eval_lengths"])
    return Rebuilt(dict(documents), target_docs, unit, "derived from the run's eval_documents (no text to check)")
