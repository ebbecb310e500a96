"""A Hugging Face model's eval text (``HFText``): the documents of one split of our corpus through the model's
tokenizer, cut into segments, with the document separator before each document as context only. What
``pretrained.eval_hf`` scores (and, with ``--tune``, the valid split it chooses each fix's options on), and what
``bench/eval/documents.py`` rebuilds from a run's record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from posenc_bench.bench.eval.evaluate import documents_in_order
from posenc_bench.data import Corpus, document_segments, eval_segments
from posenc_bench.errors import ConfigError, DataError
from posenc_bench.hf.tokenize import document_separator, separators, tokenize_documents


@dataclass
class HFText:
    """A Hugging Face model's eval text: what ``eval`` scores, and what ``bench/eval/documents.py`` rebuilds."""

    segments: torch.Tensor  # (N, S + 1) token ids of the model's tokenizer
    token_bytes: torch.Tensor  # the same shape: UTF-8 bytes behind each token
    doc_index: torch.Tensor  # the same shape: which document each token belongs to (its index in the split)
    separator: Optional[int]
    separator_how: str
    documents: dict  # name -> targets it holds, of each document scored, in scoring order (the run's eval_documents)
    target_docs: torch.Tensor  # (N, S) the document of each target: its place in ``documents``
    target_mask: torch.Tensor  # (N, S + 1) bool: False at the document separators (context only, never scored)


def hf_text(tokenizer, corpus: Corpus, S: int, eval_tokens: int, *, split: str, long_docs: bool, doc_sep: str
            ) -> HFText:
    """The eval segments through the model's tokenizer: cut from the stream of the split's documents, or
    (``long_docs``) from inside the documents of at least S + 1 tokens, one document per segment. The targets
    are those of the segments but the separators (``hf/tokenize.separators``): in the stream, the separator
    between two documents is context for the next one and no target; with ``long_docs`` no separator is a
    target anyway (a document's separator is the leading, context-only token of its first segment). A
    separator's place in ``target_docs`` is the document before it (the one it ends), so that every document
    of ``documents`` holds targets."""
    sep, sep_how = document_separator(tokenizer, doc_sep)
    docs = corpus.documents(split)
    need = -(-eval_tokens // S) * S + 1
    if not long_docs:
        tokens, nbytes, index = tokenize_documents(tokenizer, docs, sep, need)
        parts = [eval_segments(t, S, eval_tokens) for t in (tokens, nbytes, index, separators(index, sep))]
    else:
        tokens, nbytes, index = tokenize_documents(tokenizer, docs, sep, 1 << 62, min_doc_tokens=S + 1)  # all of them
        if tokens.numel() == 0:
            raise DataError(f"no document of the {split!r} split of {corpus.source!r} has {S + 1} tokens "
                            f"(--long-docs: one segment is {S + 1} tokens); use longer documents"
                            f"{'' if split == 'all' else ', or --split all'}")
        counts = torch.unique_consecutive(index, return_counts=True)[1].tolist()
        parts = [document_segments(list(t.split(counts)), S, eval_tokens)
                 for t in (tokens, nbytes, index, separators(index, sep))]
    segments, token_bytes, doc_index, opens = parts
    target_mask = opens == 0  # the segments are int64 (eval_segments, document_segments)
    is_target = target_mask[:, 1:]
    scored, target_docs = documents_in_order(torch.where(is_target, doc_index[:, 1:], doc_index[:, :-1]))
    held = torch.bincount(target_docs[is_target], minlength=len(scored)).tolist()
    documents = {docs[d][0]: n for d, n in zip(scored, held)}
    return HFText(segments, token_bytes, doc_index, sep, sep_how, documents, target_docs, target_mask)


TUNED_SPLITS = ("test", "train", "all-but-valid")  # what `eval --tune` may score: no valid document among them


def valid_text(tokenizer, corpus: Corpus, S: int, eval_tokens: int, *, split: str, long_docs: bool, doc_sep: str
               ) -> HFText:
    """The valid split, cut as the scored ``split`` is (``hf_text``'s S, tokens, documents and separator): the
    text ``eval --tune`` chooses each zero-shot row's options on (``bench/eval/tune.py``). Refused when the
    scored split holds the valid documents: a choice is never judged on the text it was made on."""
    if split not in TUNED_SPLITS:
        raise ConfigError(f"--tune chooses on the valid split: the scored --split must be one of "
                          f"{', '.join(TUNED_SPLITS)} (all-but-valid: every document but the valid ones), got {split!r}")
    return hf_text(tokenizer, corpus, S, eval_tokens, split="valid", long_docs=long_docs, doc_sep=doc_sep)
