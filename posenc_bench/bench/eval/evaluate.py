"""The evaluation protocol: the same target tokens at every length; ppl, bits per byte, loss by position.

1. Fixed segments of S + 1 tokens come from the held-out split; S is a common multiple of all eval lengths
   (their least common multiple when that is at most 4x the longest length, else the longest length, and
   then the last window of a shorter length is partial). ``eval.windows: stream`` (default) cuts them from the
   split's documents joined end to end, from its start (``data.eval_segments``), so a window may span
   documents; ``documents`` cuts each inside one document, spread over all of the split's documents of at
   least S + 1 tokens (``data.spread_segments``), so no window at any length crosses a document boundary.
   Either way the run records the documents scored and the targets of each (``EvalSet.meta``).
2. For each eval length L, every segment is cut into consecutive non-overlapping windows: window w feeds
   tokens [wL, wL + L) and scores the next token at each place, i.e. targets [wL + 1, wL + L + 1).
3. So each target of a segment (tokens 1..S) is scored exactly once at every length, and the first input
   token of every window is context only: it was the previous window's last target (or, for the first
   window, the segment's leading token). This is the same for every length; only the context changes.
4. ppl = exp(sum of target NLL / number of targets), token-weighted over all windows and segments;
   bpb = sum NLL / ln 2 / bytes of text behind the targets (BOS targets mark document starts, 0 bytes; with
   another tokenizer, ``token_bytes`` gives each token's UTF-8 bytes: our BPE's table, ``tokenizer.py``, or a
   Hugging Face tokenizer's offsets, ``hf/tokenize.py``). ``target_mask`` can leave tokens out of the
   targets (context only): a pretrained model's document separators (``hf/tokenize.separators``).
5. For intervals (``analysis/stats/intervals.py``) each result also keeps the NLL sum, target count and byte count of
   every resampling unit: consecutive blocks of ``Scoring.unit`` targets (the run's longest eval length) within
   each segment, numbered segment by segment. A unit is a set of target positions, so it is the same text at
   every length and for every row of a run; at the longest length it is exactly one window (its own context),
   at shorter lengths it holds several windows. Each unit also names its document (``units["doc"]``: the place,
   in the run's ``eval_documents``, of the document that holds most of its targets, the earlier on a tie;
   ``unit_documents``), so that intervals can resample whole documents instead of units.
6. Each window has a run-wide index, the position of its first input token in the flattened segments
   (``window_ids``): our models' encodings hear it before each forward (``Encoding.set_eval_windows``), so an
   encoding with random eval positions per window (``+rand``'s per-sequence sampler) draws them per window,
   whatever the batch size.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F

from posenc_bench.data import count_bytes
from posenc_bench.progress import progress_bar


def segment_length(lengths: list[int]) -> int:
    longest = max(lengths)
    common = math.lcm(*lengths)
    return common if common <= 4 * longest else longest


def windows(segments: torch.Tensor, length: int, stride: Optional[int] = None
            ) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """[(inputs (N, l), targets (N, l), first scored column), ...] per window offset.

    Without ``stride`` (or stride >= length): non-overlapping windows, every column scored; l = length except
    a partial last window. With a smaller stride (the strided protocol): the first window scores all its
    targets, then each window ends ``stride`` targets further and scores only its last ``stride`` (fewer in
    a final window), so every scored target past the first window sees at least length - stride tokens of
    context. Either way each target of a segment (tokens 1..S) is scored exactly once.
    """
    S = segments.shape[1] - 1
    out = []
    if stride is None or stride >= length or S <= length:
        for start in range(0, S, length):
            end = min(S, start + length)
            out.append((segments[:, start:end], segments[:, start + 1 : end + 1], 0))
        return out
    if stride < 1:
        raise ValueError(f"stride must be >= 1 token, got {stride}")
    done = length
    out.append((segments[:, :length], segments[:, 1 : length + 1], 0))
    while done < S:
        end = min(S, done + stride)
        out.append((segments[:, end - length : end], segments[:, end - length + 1 : end + 1], length - (end - done)))
        done = end
    return out


def documents_per_window(doc_index: torch.Tensor, length: int, stride: Optional[int] = None) -> float:
    """Mean number of documents the inputs of a window of ``length`` span: ``doc_index`` (N, S + 1), the
    document of each token of the segments (non-decreasing along a segment, as the stream is)."""
    spans = [inputs.max(1).values - inputs.min(1).values + 1 for inputs, _, _ in windows(doc_index, length, stride)]
    return float(torch.cat(spans).double().mean())  # spans (N,) per window offset


def logits_nll(forward: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``forward(idx) -> logits (b, l, V)`` as ``nll(inputs, targets) -> (b, l)`` NLL per target (float32 softmax)."""

    def nll(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = forward(x)  # (b, l, V)
        return F.cross_entropy(logits.float().flatten(0, 1), y.to(logits.device).flatten(), reduction="none").view(y.shape)

    return nll


@dataclass(frozen=True)
class Scoring:
    """How windows are batched and reported: tokens per forward pass, loss-by-position buckets over
    [0, bucket_span) (default: the length itself), the strided protocol's stride (None: non-overlapping), and
    the resampling unit in targets (default: bucket_span, else the length; runs use their longest length)."""

    batch_tokens: int = 16384
    buckets: int = 64
    bucket_span: Optional[int] = None
    stride: Optional[int] = None
    unit: Optional[int] = None


class _Units:
    """Per-unit sums of one evaluation: NLL, targets and bytes of each block of ``size`` consecutive targets
    of each segment (the module docstring's point 5)."""

    def __init__(self, n_segments: int, targets: int, size: int, keyed: bool = False) -> None:
        self.size = size
        shape = (n_segments, -(-targets // size))  # (segments, units per segment)
        self.nll, self.tokens, self.bytes = (torch.zeros(shape, dtype=torch.float64) for _ in range(3))
        # with key tokens (``Targets.key``): the NLL and count of each unit's key targets (``key_tokens.py``)
        self.key_nll, self.key_tokens = (torch.zeros(shape, dtype=torch.float64) if keyed else None for _ in range(2))

    def add(self, rows: slice, unit_of: torch.Tensor, nll: torch.Tensor, nbytes: torch.Tensor,
            counted: torch.Tensor, key: Optional[torch.Tensor] = None) -> None:
        """nll, nbytes, counted (1.0 for a target, 0.0 for context only), key (bool, or None) (b, cols) of
        segments ``rows``; unit_of (cols,) each column's unit."""
        self.nll[rows].index_add_(1, unit_of, nll)
        self.tokens[rows].index_add_(1, unit_of, counted)
        self.bytes[rows].index_add_(1, unit_of, nbytes.double())
        if self.key_nll is not None:
            self.key_nll[rows].index_add_(1, unit_of, torch.where(key, nll, 0.0))
            self.key_tokens[rows].index_add_(1, unit_of, key.to(nll.dtype))

    def as_dict(self) -> dict:
        out = {"size": self.size, "nll": self.nll.flatten().tolist(), "tokens": self.tokens.flatten().int().tolist(),
               "bytes": self.bytes.flatten().int().tolist()}
        if self.key_nll is not None:
            out |= {"key_nll": self.key_nll.flatten().tolist(), "key_tokens": self.key_tokens.flatten().int().tolist()}
        return out


class Targets(NamedTuple):
    """Per-token facts of the scored text beyond its ids, each the shape of the segments: ``token_bytes``, the
    bytes of text behind each token, for tokenizers other than ours (None: 1 per byte token, 0 for BOS), and
    ``mask`` (bool; None: all), which tokens are targets where they are predicted; the others are context only,
    in no sum or count (a pretrained model's document separators); ``key`` (bool; None: no key tokens), the key
    tokens of this eval length (``key_tokens.py``), whose NLL and count each unit also sums (``key_nll``,
    ``key_tokens``: LongPPL, ``metrics/longppl.py``)."""

    token_bytes: Optional[torch.Tensor] = None
    mask: Optional[torch.Tensor] = None
    key: Optional[torch.Tensor] = None


def evaluate_length(
    forward: Callable[[torch.Tensor], torch.Tensor],
    segments: torch.Tensor,
    length: int,
    scoring: Scoring = Scoring(),
    *,
    device: torch.device | str = "cpu",
    show_progress: Optional[bool] = False,
    token_bytes: Optional[torch.Tensor] = None,
) -> dict:
    """Score every target of ``segments`` with windows of ``length`` tokens; ``forward(idx) -> logits``.

    ``token_bytes`` (same shape as ``segments``) gives the bytes of text behind each token, for tokenizers
    other than ours (default: 1 per byte token, 0 for BOS); ``score_windows`` takes a loss function instead of
    ``forward`` and context-only tokens (``Targets``).
    ``scoring.stride``: the strided protocol (see ``windows``); None is the default non-overlapping protocol.
    Returns loss (mean NLL, nats), ppl, bpb, tokens, bytes, loss_by_position (``scoring.buckets`` equal spans
    of window positions over [0, bucket_span) (default: length), each with its mean loss and token count) and
    units (see the module docstring: the unit size and, per unit, its NLL sum, targets and bytes).
    """
    return score_windows(logits_nll(forward), segments, length, scoring, device=device,
                         show_progress=show_progress, targets=Targets(token_bytes))


def window_ids(rows: slice, start: int, segment_tokens: int) -> torch.Tensor:
    """(b,) int64: the run-wide index of the windows of segments ``rows`` whose first input token is column
    ``start``: that token's index in the flattened segments, so it does not depend on the batch size, and a
    window of the same text has the same index at every length."""
    return torch.arange(rows.start, rows.stop, dtype=torch.int64) * segment_tokens + start


@torch.inference_mode()
def score_windows(
    nll_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    segments: torch.Tensor,
    length: int,
    scoring: Scoring = Scoring(),
    *,
    device: torch.device | str = "cpu",
    show_progress: Optional[bool] = False,
    targets: Targets = Targets(),
    on_windows: Optional[Callable[[Optional[torch.Tensor]], None]] = None,
) -> dict:
    """``evaluate_length`` with the loss function given (a pretrained model's chunked LM head: ``hf/model.py``)
    and the text's ``targets`` (``Targets``: bytes per token, context-only tokens); ``on_windows(ids)``
    (optional) is called before each forward with the (b,) index of each window in it (``window_ids``), and
    with None when all are scored (our models pass their encoding's ``set_eval_windows``: ``+rand``'s
    per-sequence sampler seeds its eval positions by window)."""
    buckets, stride = scoring.buckets, scoring.stride
    span = scoring.bucket_span or length
    width = -(-span // buckets)
    nll_sum = torch.zeros((), dtype=torch.float64)
    pos_sum = torch.zeros(buckets, dtype=torch.float64)
    pos_count = torch.zeros(buckets, dtype=torch.float64)
    n_tokens = 0
    n_bytes = 0
    token_bytes, target_mask, key_mask = targets
    units = _Units(segments.shape[0], segments.shape[1] - 1, scoring.unit or span, key_mask is not None)
    scored = 0  # targets of each segment scored so far: windows come in order and score each target once
    t0 = time.perf_counter()
    parts = windows(segments, length, stride)
    byte_parts = windows(token_bytes, length, stride) if token_bytes is not None else [None] * len(parts)
    mask_parts = windows(target_mask, length, stride) if target_mask is not None else [None] * len(parts)
    key_parts = windows(key_mask, length, stride) if key_mask is not None else [None] * len(parts)
    rows_per_batch = max(1, scoring.batch_tokens // length)
    total = sum(-(-inp.shape[0] // rows_per_batch) for inp, _, _ in parts)
    with progress_bar(total, f"eval L={length}", show_progress) as bar:
        for (inputs, targets, first), byte_part, mask_part, key_part in zip(parts, byte_parts, mask_parts, key_parts):
            l = inputs.shape[1]
            bucket_of = (torch.arange(first, l) // width).clamp(max=buckets - 1)  # (scored columns,)
            unit_of = (scored + torch.arange(l - first)) // units.size  # (scored columns,) unit within the segment
            for i in range(0, inputs.shape[0], rows_per_batch):
                x = inputs[i : i + rows_per_batch].to(device)
                y = targets[i : i + rows_per_batch]
                if on_windows is not None:  # the window starts at column scored - first of its segment
                    on_windows(window_ids(slice(i, i + y.shape[0]), scored - first, segments.shape[1]))
                try:
                    nll = nll_fn(x, y).double().cpu()[:, first:]  # (b, scored columns)
                finally:
                    if on_windows is not None:
                        on_windows(None)
                y = y[:, first:]
                b = (y < 256) if byte_part is None else byte_part[1][i : i + rows_per_batch, first:]  # (b, cols)
                if mask_part is None:
                    counted = torch.ones_like(nll)
                else:  # (b, cols) the targets; context-only tokens add nothing anywhere
                    is_target = mask_part[1][i : i + rows_per_batch, first:].bool()
                    nll, b, counted = torch.where(is_target, nll, 0.0), b * is_target, is_target.to(nll.dtype)
                nll_sum += nll.sum()
                pos_sum.index_add_(0, bucket_of, nll.sum(0))
                pos_count.index_add_(0, bucket_of, counted.sum(0))
                key = None if key_part is None else key_part[1][i : i + rows_per_batch, first:].bool() & counted.bool()
                units.add(slice(i, i + y.shape[0]), unit_of, nll, b, counted, key)
                n_tokens += int(counted.sum())
                n_bytes += count_bytes(y[counted.bool()]) if byte_part is None else int(b.sum())
                bar.update(1)
            scored += l - first
    expected = segments.shape[0] * (segments.shape[1] - 1) if target_mask is None else int(target_mask[:, 1:].sum())
    if n_tokens != expected:  # the protocol's invariant: every target of every segment, once
        raise AssertionError(f"scored {n_tokens} targets at length {length}, expected {expected}")
    return _result(nll_sum, n_tokens, n_bytes, _by_position(pos_sum, pos_count, width, span), units,
                   time.perf_counter() - t0)


def _by_position(pos_sum: torch.Tensor, pos_count: torch.Tensor, width: int, span: int) -> list[dict]:
    """The loss-by-position buckets that hold targets: start, end, mean loss, targets."""
    return [{"start": b * width, "end": min((b + 1) * width, span), "loss": float(pos_sum[b] / pos_count[b]),
             "tokens": int(pos_count[b])} for b in range(pos_sum.shape[0]) if pos_count[b] > 0]


def _result(nll_sum: torch.Tensor, n_tokens: int, n_bytes: int, by_pos: list[dict], units: _Units,
            seconds: float) -> dict:
    loss = float(nll_sum) / n_tokens
    return {
        "loss": loss,
        "ppl": math.exp(loss),
        "bpb": float(nll_sum) / math.log(2) / max(1, n_bytes),
        "tokens": n_tokens,
        "bytes": n_bytes,
        "loss_by_position": by_pos,
        "units": units.as_dict(),
        "eval_time_s": seconds,
    }


# ---- our models on a run's eval set -------------------------------------------------------------------

@dataclass
class EvalSet:
    """The target tokens every row of a run is scored on, and how: built once per run from its config."""

    segments: torch.Tensor  # (N, S + 1) int16 tokens; S a common multiple of the lengths (segment_length)
    lengths: list[int]
    scoring: Scoring
    documents: dict = field(default_factory=dict)  # name -> targets it holds, of each document scored
    skipped: Optional[int] = None  # eval.windows documents: the split's documents shorter than a segment
    token_bytes: Optional[torch.Tensor] = None  # (N, S + 1) bytes behind each token; None: byte tokens
    tokenizer: Optional[dict] = None  # a BPE's name and fingerprint (part of the eval fingerprint); None: bytes
    target_docs: Optional[torch.Tensor] = None  # (N, S) the document of each target: its place in ``documents``
    # eval.key_tokens: length -> (N, S + 1) bool, the evaluator's key tokens (key_tokens.py), set by the sweep
    key_tokens: dict = field(default_factory=dict)

    @classmethod
    def for_run(cls, cfg, corpus) -> "EvalSet":
        """``cfg``'s eval lengths, tokens, split, windows and protocol on ``corpus`` (a ``data.Corpus``)."""
        from posenc_bench.data import eval_segments, spread_segments

        lengths = cfg.eval_lengths()
        S = segment_length(lengths)
        docs = corpus.document_tokens(cfg.eval.split)
        scoring = Scoring(cfg.eval.batch_tokens, cfg.eval.position_buckets, max(lengths), cfg.eval.stride or None,
                          max(lengths))
        if cfg.eval.windows == "documents":
            segments, names = spread_segments(docs, S, cfg.eval.tokens)
            skipped = sum(1 for _, tokens in docs if tokens.numel() < S + 1)
            documents = {n: S * names.count(n) for n in dict.fromkeys(names)}  # segments come in document order
            place = {n: i for i, n in enumerate(documents)}
            target_docs = torch.tensor([place[n] for n in names])[:, None].expand(-1, S)
            out = cls(segments, lengths, scoring, documents, skipped, target_docs=target_docs)
        else:
            segments = eval_segments(torch.cat([tokens for _, tokens in docs]), S, cfg.eval.tokens)
            out = cls(segments, lengths, scoring, stream_documents(docs, segments.shape[0] * S),
                      target_docs=stream_target_documents(docs, segments.shape[0], S))
        tok = corpus.tokenizer
        if tok.fingerprint is not None:  # a BPE: bits per byte from its tokens' bytes
            out.token_bytes = tok.token_bytes()[out.segments]  # (N, S + 1)
            out.tokenizer = {"name": tok.name, "fingerprint": tok.fingerprint}
        return out

    def unit_documents(self, unit_size: Optional[int] = None) -> list[int]:
        """The document of each resampling unit of ``unit_size`` targets (default: the run's unit), numbered as
        the units of a result are: ``unit_documents`` of this set's targets."""
        if self.target_docs is None:
            raise ValueError("this eval set was built without the document of each target (EvalSet.for_run has it)")
        return unit_documents(self.target_docs, unit_size or self.scoring.unit or max(self.lengths))

    def meta(self) -> dict:
        """What the run's metadata records of the text: the documents scored (targets each), how many the
        document-bounded windows skipped, and a BPE's name and fingerprint (``tokenizer``) and the bytes of text
        behind the targets (``eval_bytes``)."""
        return {"eval_documents": self.documents,
                **({"eval_documents_skipped": self.skipped} if self.skipped is not None else {}),
                **({"tokenizer": self.tokenizer, "eval_bytes": int(self.token_bytes[:, 1:].sum())} if self.tokenizer else {})}


def stream_documents(docs: list[tuple[str, torch.Tensor]], targets: int) -> dict:
    """name -> targets of each document whose tokens are among targets 1 .. ``targets`` of the stream."""
    out, start = {}, 0
    for name, tokens in docs:
        end = start + tokens.numel()
        held = max(0, min(end, targets + 1) - max(start, 1))
        if held:
            out[name] = held
        start = end
    return out


def stream_target_documents(docs: list[tuple[str, torch.Tensor]], n_segments: int, segment_len: int) -> torch.Tensor:
    """(n_segments, segment_len) the document of each target of the stream's segments (``data.eval_segments``):
    its place among the documents that hold targets, in stream order, i.e. in ``stream_documents``'s order."""
    ends = torch.tensor([tokens.numel() for _, tokens in docs]).cumsum(0)  # stream position after each document
    positions = torch.arange(n_segments)[:, None] * segment_len + torch.arange(1, segment_len + 1)  # the targets'
    return documents_in_order(torch.searchsorted(ends, positions, right=True))[1]


def documents_in_order(labels: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """(the distinct ``labels`` in the order of their first place in ``labels`` flattened, i.e. in scoring order,
    each label's place in that list, in the shape of ``labels``): any document labels (a document's index in
    its split) as places in the run's ``eval_documents``, which lists documents in scoring order."""
    flat = labels.flatten()
    distinct, inverse = torch.unique(flat, return_inverse=True)
    first = torch.full((distinct.numel(),), flat.numel()).scatter_reduce(0, inverse, torch.arange(flat.numel()), "amin")
    order = torch.argsort(first)
    place = torch.empty_like(order)
    place[order] = torch.arange(order.numel())
    return distinct[order].tolist(), place[inverse].view(labels.shape)


def unit_documents(target_docs: torch.Tensor, unit_size: int) -> list[int]:
    """The document of each resampling unit (the one home of this rule, for our models and pretrained ones).

    ``target_docs`` (N, S): the document of each target of each segment, as its place in the run's
    ``eval_documents``. The units are ``_Units``'s: blocks of ``unit_size`` consecutive targets of each segment
    (the last one of a segment shorter when ``unit_size`` does not divide S), numbered segment by segment. A
    unit's document is the one that holds most of its targets; on a tie, the earlier one in ``eval_documents``.
    """
    if unit_size < 1:
        raise ValueError(f"a resampling unit holds at least 1 target, got {unit_size}")
    n, S = target_docs.shape
    per_segment = -(-S // unit_size)
    padded = torch.zeros(n, per_segment * unit_size, dtype=torch.int64)  # 0: no target (a short last unit)
    padded[:, :S] = target_docs.to(torch.int64) + 1
    blocks = padded.view(n * per_segment, unit_size)  # (units, unit_size), in the units' order
    counts = torch.zeros(blocks.shape[0], int(padded.max()) + 1, dtype=torch.int64)
    counts.scatter_add_(1, blocks, torch.ones_like(blocks))
    return counts[:, 1:].argmax(1).tolist()  # argmax: the first of equal counts, i.e. the earlier document


def evaluate_model(model, evalset: EvalSet, length: int, rt) -> dict:
    """One eval length for one of our models (``rt``: a bench.runtime.Runtime); raises PositionOutOfRange where
    the encoding cannot run at this length. The encoding learns each window's index (``set_eval_windows``), and
    the units name their documents (``EvalSet.unit_documents``), and the key tokens of ``length`` (where the set
    has them: ``EvalSet.key_tokens``) give each unit's key-token sums."""
    model.encoding.set_eval_length(length)
    model.eval()
    with rt.autocast_context():
        res = score_windows(logits_nll(model), evalset.segments, length, evalset.scoring, device=rt.device,
                            show_progress=rt.show_progress,
                            targets=Targets(evalset.token_bytes, key=evalset.key_tokens.get(length)),
                            on_windows=model.encoding.set_eval_windows)
    res["units"]["doc"] = evalset.unit_documents(res["units"]["size"])
    return res
