"""Text through a Hugging Face tokenizer, with the UTF-8 bytes behind every token (for bits per byte).

Each document is preceded by a separator token (BOS when the tokenizer adds one itself, else EOS: the
document boundary as the model saw it in pretraining). Every token carries the bytes of text it covers (from
the tokenizer's offsets; the separator covers none), so bits per byte compare across tokenizers.
"""

from __future__ import annotations

from typing import Iterator, Optional

import torch

from posenc_bench.errors import ConfigError, DataError


def document_separator(tokenizer, choice: str = "auto") -> tuple[Optional[int], str]:
    """(token id put before every document or None, how it was chosen)."""
    if choice == "none":
        return None, "none"
    if choice != "auto":
        vocab = tokenizer.get_vocab()
        if choice not in vocab:
            raise ConfigError(f"--doc-sep {choice!r} is not a token of this tokenizer; give auto, none, or a token "
                              f"such as {', '.join(repr(t) for t in tokenizer.all_special_tokens[:5])}")
        return vocab[choice], f"{choice!r} (given)"
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    probe = tokenizer("a")["input_ids"]
    if bos is not None and probe and probe[0] == bos:
        return bos, f"bos {tokenizer.bos_token!r} (the tokenizer adds it)"
    if eos is not None:
        return eos, f"eos {tokenizer.eos_token!r} (between documents, GPT-2 style)"
    if bos is not None:
        return bos, f"bos {tokenizer.bos_token!r}"
    return None, "none (the tokenizer has no bos or eos)"


def recorded_separator(how: str) -> str:
    """The ``--doc-sep`` choice that gives again the separator a run recorded (``document_separator``'s second
    value, the run's ``doc_separator``): the token itself, named, so that a tokenizer read by another release
    (which may name another token its eos) still puts the same token between documents; "none" for none."""
    import ast
    import re

    if how.startswith("none"):
        return "none"
    quoted = re.match(r"^(?:bos |eos )?('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")", how)
    if quoted is None:
        raise ConfigError(f"doc_separator {how!r} is not one that document_separator records (bos '<s>' (...), "
                          "eos '<eos>' (...), '<token>' (given), none)")
    return ast.literal_eval(quoted.group(1))


def token_bytes_of(text: str, offsets: list[tuple[int, int]]) -> list[int]:
    """UTF-8 bytes of ``text`` behind each token: token i covers characters [start_i, start_{i+1}) (the first
    from 0, the last to the end), so the tokens of a document cover its bytes exactly once."""
    n = len(text)
    starts, last = [], 0
    for i, (s, _) in enumerate(offsets):
        last = 0 if i == 0 else min(n, max(last, s))
        starts.append(last)
    bounds = starts + [n]
    if text.isascii():
        return [bounds[i + 1] - bounds[i] for i in range(len(starts))]
    byte_at = [0] * (n + 1)
    for i, ch in enumerate(text):
        byte_at[i + 1] = byte_at[i] + len(ch.encode("utf-8", errors="replace"))
    return [byte_at[bounds[i + 1]] - byte_at[bounds[i]] for i in range(len(starts))]


def _documents(tokenizer, docs: list[tuple[str, bytes]], sep: Optional[int]) -> Iterator[tuple[list[int], list[int]]]:
    """(token ids, bytes per token) of each document in order, the separator first (0 bytes)."""
    from transformers.utils import logging as hf_logging

    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"tokenizer {type(tokenizer).__name__} is not a fast tokenizer: bits per byte need its "
                          "character offsets (install `tokenizers`, or convert the tokenizer)")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "sequence longer than model_max_length": we cut windows ourselves
    try:
        for name, raw in docs:
            text = raw.decode("utf-8", errors="replace")
            enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            counts = token_bytes_of(text, enc["offset_mapping"])
            if sum(counts) != len(text.encode("utf-8")) and enc["input_ids"]:
                raise DataError(f"token offsets of document {name!r} do not cover its text")
            head = [] if sep is None else [sep]
            yield head + list(enc["input_ids"]), [0] * len(head) + counts
    finally:
        hf_logging.set_verbosity(verbosity)


def tokenize_documents(tokenizer, docs: list[tuple[str, bytes]], sep: Optional[int], min_tokens: int,
                       min_doc_tokens: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens, bytes per token, document index per token), 1-D int64: [sep] + doc tokens for documents in
    order, until at least ``min_tokens`` tokens (or all documents). The separator covers 0 bytes and belongs
    to the document it opens. With ``min_doc_tokens``, shorter documents (separator included) are left out."""
    ids: list[int] = []
    nbytes: list[int] = []
    index: list[int] = []
    for i, (doc_ids, counts) in enumerate(_documents(tokenizer, docs, sep)):
        if len(doc_ids) < min_doc_tokens:
            continue
        ids.extend(doc_ids)
        nbytes.extend(counts)
        index.extend([i] * len(doc_ids))
        if len(ids) >= min_tokens:
            break
    return (torch.tensor(ids, dtype=torch.int64), torch.tensor(nbytes, dtype=torch.int64),
            torch.tensor(index, dtype=torch.int64))
