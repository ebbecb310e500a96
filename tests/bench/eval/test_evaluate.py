"""The evaluation protocol (bench/eval/evaluate.py): the same targets at every length and stride, token-weighted ppl
against hand computations and transformers, loss by position, resampling units, documents per window, the
run-wide index of each window, windows bounded by documents, the documents a run scores and the document of each
resampling unit."""

import math

import pytest
import torch

from posenc_bench.bench.config import RunConfig
from posenc_bench.bench.eval.evaluate import (EvalSet, Scoring, documents_in_order, documents_per_window, evaluate_length,
                                              evaluate_model, logits_nll, score_windows, segment_length,
                                              stream_documents, Targets, unit_documents, windows)
from posenc_bench.data import BOS, Corpus


def segments(n=3, S=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 257, (n, S + 1), generator=g)


def test_segment_length_is_a_common_multiple_when_reasonable():
    assert segment_length([128, 192, 256, 512]) == 1536
    assert segment_length([2048, 4096]) == 4096
    assert segment_length([1000, 1001]) == 1001  # lcm too large: longest length, partial windows


@pytest.mark.parametrize("length", [1, 5, 8, 12, 24])
def test_every_length_scores_exactly_the_same_targets(length):
    seg = segments()
    got = torch.cat([t for _, t, _ in windows(seg, length)], dim=1)  # targets in order
    assert torch.equal(got, seg[:, 1:])
    for inp, tgt, first in windows(seg, length):
        assert inp.shape == tgt.shape and inp.shape[1] <= length and first == 0


@pytest.mark.parametrize("length, stride", [(8, 1), (8, 3), (8, 5), (12, 4), (24, 7)])
def test_strided_windows_score_every_target_once_with_enough_context(length, stride):
    seg = segments()
    parts = windows(seg, length, stride)
    got = torch.cat([t[:, first:] for _, t, first in parts], dim=1)  # the scored targets, in order
    assert torch.equal(got, seg[:, 1:])  # every target exactly once
    for k, (inp, tgt, first) in enumerate(parts):
        assert inp.shape == tgt.shape and inp.shape[1] == length  # full-length windows
        assert torch.equal(inp[:, 1:], tgt[:, :-1])  # inputs and targets are the same text, shifted by one
        if k == 0:
            assert first == 0
        else:  # the scored targets see at least length - stride tokens of this window before them
            assert length - stride <= first < length


def test_stride_of_the_length_is_the_non_overlapping_protocol():
    seg = segments()
    model = Bigram()
    plain = evaluate_length(model, seg, 8, Scoring(batch_tokens=64))
    for stride in (8, 100):
        same = evaluate_length(model, seg, 8, Scoring(batch_tokens=64, stride=stride))
        assert same["loss"] == plain["loss"] and same["loss_by_position"] == plain["loss_by_position"]
    strided = evaluate_length(model, seg, 8, Scoring(batch_tokens=64, stride=3))
    # a context-free model: the same targets give the same total loss whatever the windows
    assert strided["tokens"] == plain["tokens"] and strided["loss"] == pytest.approx(plain["loss"], rel=1e-12)
    assert strided["bytes"] == plain["bytes"]
    first_bucket = strided["loss_by_position"][0]
    assert first_bucket["tokens"] == seg.shape[0]  # position 0 is scored in the first window only


class Bigram(torch.nn.Module):
    """A context-free model with known log-probabilities, for a hand computation."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.table = torch.randn(257, 257, generator=g)

    def forward(self, idx):
        return self.table[idx]


def test_ppl_is_token_weighted_and_matches_a_hand_computation():
    seg = segments()
    model = Bigram()
    logp = model.table.log_softmax(-1)
    inputs, targets = seg[:, :-1].flatten(), seg[:, 1:].flatten()
    hand = -sum(float(logp[i, t]) for i, t in zip(inputs.tolist(), targets.tolist())) / targets.numel()
    for length in (8, 5, 24):  # a bigram's context is one token, so every length gives the same ppl
        res = evaluate_length(model, seg, length, Scoring(batch_tokens=7))
        assert res["tokens"] == targets.numel()
        assert res["loss"] == pytest.approx(hand, rel=1e-9)
        assert res["ppl"] == pytest.approx(math.exp(hand), rel=1e-9)
        n_bytes = int((targets < 256).sum())
        assert res["bytes"] == n_bytes
        assert res["bpb"] == pytest.approx(hand * targets.numel() / math.log(2) / n_bytes, rel=1e-9)


def test_uniform_model_has_ppl_equal_to_vocabulary():
    res = evaluate_length(lambda idx: torch.zeros(*idx.shape, 257), segments(), 6)
    assert res["ppl"] == pytest.approx(257.0, rel=1e-6)  # float32 log-softmax


def test_loss_by_position_buckets():
    seg = segments(n=2, S=16)
    res = evaluate_length(Bigram(), seg, 8, Scoring(buckets=4, bucket_span=16))
    spans = [(b["start"], b["end"]) for b in res["loss_by_position"]]
    assert spans == [(0, 4), (4, 8)]  # only positions < 8 exist at length 8
    assert sum(b["tokens"] for b in res["loss_by_position"]) == res["tokens"]
    weighted = sum(b["loss"] * b["tokens"] for b in res["loss_by_position"]) / res["tokens"]
    assert weighted == pytest.approx(res["loss"], rel=1e-9)


def test_matches_transformers_own_loss():
    """Our ppl on a tiny Llama equals exp of transformers' loss on the same windows (token-weighted)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=257, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval()
    seg = segments(n=2, S=30)
    length = 12  # windows of 12, 12 and a partial 6
    ours = evaluate_length(lambda idx: model(idx).logits, seg, length)
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, 30, length):
            end = min(30, start + length)
            ids = seg[:, start : end + 1]  # transformers shifts labels itself
            n = ids.shape[0] * (ids.shape[1] - 1)
            total += float(model(ids, labels=ids).loss) * n
            count += n
    assert ours["tokens"] == count
    assert ours["ppl"] == pytest.approx(math.exp(total / count), rel=1e-4)


def nll_by_id(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A model whose NLL of each target is the target's id."""
    return targets.double()


@pytest.mark.parametrize("stride", [None, 3])
def test_a_token_outside_the_target_mask_is_context_only(stride):
    """A hand computation: a separator (9) between two documents is fed to the model but is no target. The
    model's NLL of each target is the target's id, so the documents' targets 1..7 give loss 28 / 7 = 4 at every
    length (with the separator scored it would be 37 / 8); it is in no count, unit or position bucket."""
    seg = torch.tensor([[9, 1, 2, 3, 9, 4, 5, 6, 7]])  # [separator] document [separator] document
    mask = seg != 9
    nbytes = mask.long()  # a byte a token, none behind a separator
    for length in (1, 2, 4, 8):
        res = score_windows(nll_by_id, seg, length, Scoring(batch_tokens=8, buckets=4, bucket_span=4, stride=stride,
                                                            unit=4), targets=Targets(nbytes, mask))
        assert (res["loss"], res["tokens"], res["bytes"]) == (4.0, 7, 7)
        assert res["bpb"] == pytest.approx(28 / math.log(2) / 7, rel=1e-12)
        assert res["units"]["nll"] == [6.0, 22.0] and res["units"]["tokens"] == [3, 4]  # targets 1-3 (and 9), 4-7
        assert res["units"]["bytes"] == [3, 4]
        assert sum(b["tokens"] for b in res["loss_by_position"]) == 7
    by_position = score_windows(nll_by_id, seg, 4, Scoring(buckets=4, bucket_span=4),
                                targets=Targets(mask=mask))["loss_by_position"]
    assert [(b["loss"], b["tokens"]) for b in by_position] == [(2.5, 2), (3.5, 2), (4.5, 2), (7.0, 1)]  # not 9
    assert score_windows(nll_by_id, seg, 4)["loss"] == 37 / 8  # no mask: all scored


@pytest.mark.parametrize("stride", [None, 3])
def test_units_are_the_same_targets_at_every_length(stride):
    """Each unit holds the NLL of a fixed block of target positions: a context-free model gives the same unit
    sums at every length and protocol, equal to a hand computation, and the units add up to the totals."""
    seg = segments()  # (N, S + 1)
    model = Bigram()
    logp = model.table.log_softmax(-1)
    N, S, unit = seg.shape[0], seg.shape[1] - 1, 8
    nll = -logp[seg[:, :-1], seg[:, 1:]].double()  # (N, S) each target's NLL
    hand = torch.nn.functional.pad(nll, (0, -S % unit)).view(N, -1, unit).sum(-1).flatten()  # (N * units,)
    for length in (8, 5, 24):
        res = evaluate_length(model, seg, length, Scoring(batch_tokens=7, stride=stride, unit=unit))
        u = res["units"]
        assert u["size"] == unit and len(u["nll"]) == N * -(-S // unit)
        assert torch.allclose(torch.tensor(u["nll"], dtype=torch.float64), hand, rtol=1e-6, atol=1e-5)
        assert sum(u["tokens"]) == res["tokens"] and sum(u["bytes"]) == res["bytes"]
        assert sum(u["nll"]) == pytest.approx(res["loss"] * res["tokens"], rel=1e-9)


def test_documents_per_window_counts_what_each_window_spans():
    doc = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2]])  # (1, S + 1) with S = 8
    assert documents_per_window(doc, 8) == 3.0  # inputs are tokens 0..7: documents 0, 1, 2
    assert documents_per_window(doc, 4) == pytest.approx((2 + 2) / 2)  # [0,0,0,1], [1,2,2,2]
    assert documents_per_window(doc, 2) == pytest.approx((1 + 2 + 2 + 1) / 4)


@pytest.mark.parametrize("stride", [None, 3])
def test_each_window_gets_a_run_wide_index_whatever_the_batch_size(stride):
    """The index ``on_windows`` hears before each forward is the flattened position of the window's first input
    token: the same for the same window at any batch size, and None again after every forward."""
    seg = segments(n=5)
    heard, inputs = [], []

    def forward(x):
        inputs.append(x)
        return torch.zeros(*x.shape, 257)

    for batch_tokens in (8, 24, 1000):
        calls = []
        score_windows(logits_nll(forward), seg, 8, Scoring(batch_tokens=batch_tokens, stride=stride),
                      on_windows=calls.append)
        assert calls[1::2] == [None] * (len(calls) // 2) and all(c is not None for c in calls[::2])
        ids = torch.cat(calls[::2])
        assert torch.equal(seg.flatten()[ids], torch.cat([x[:, 0] for x in inputs]))  # each window's first token
        assert ids.unique().numel() == ids.numel()
        heard.append(sorted(ids.tolist()))
        inputs.clear()
    assert heard[0] == heard[1] == heard[2]


def eval_config(windows, tokens=64):
    cfg = RunConfig()
    cfg.train.train_len, cfg.eval.lens, cfg.eval.tokens, cfg.eval.windows = 8, ["1x", "2x"], tokens, windows
    return cfg  # S = 16


def lettered_corpus():
    """Documents of one repeated letter each (a: 10 bytes, too short for a segment of 16; b: 40; c: 70; d: 33)."""
    docs = [(name, name.encode() * n) for name, n in (("a", 10), ("b", 40), ("c", 70), ("d", 33))]
    return Corpus("test", {"train": [], "valid": [], "test": docs}, "fp")


def test_the_document_bounded_windows_never_cross_a_boundary():
    evalset = EvalSet.for_run(eval_config("documents"), lettered_corpus())
    assert evalset.segments.shape == (4, 17) and evalset.skipped == 1
    assert evalset.documents == {"b": 16, "c": 32, "d": 16}  # every long document; c (the partial round's) twice
    assert evalset.meta() == {"eval_documents": {"b": 16, "c": 32, "d": 16}, "eval_documents_skipped": 1}
    for length in evalset.lengths:
        for inputs, targets, _ in windows(evalset.segments, length):
            for row in torch.cat((inputs, targets), 1):
                assert len(set(row[row != BOS].tolist())) == 1  # one document's letter
                assert (row[1:] != BOS).all()  # a document start only as a window's first token
    stream = EvalSet.for_run(eval_config("stream"), lettered_corpus())  # the stream's windows do cross
    crossing = [row for inputs, _, _ in windows(stream.segments, 16) for row in inputs
                if len(set(row.tolist()) - {BOS}) > 1]
    assert crossing and stream.skipped is None and stream.meta() == {"eval_documents": {"a": 10, "b": 41, "c": 13}}


def test_stream_documents_count_the_targets_of_each_document():
    docs = [("a", torch.zeros(5)), ("b", torch.zeros(3)), ("c", torch.zeros(10))]  # stream tokens 0-4, 5-7, 8-17
    assert stream_documents(docs, 8) == {"a": 4, "b": 3, "c": 1}  # targets are tokens 1 .. 8
    assert stream_documents(docs, 17) == {"a": 4, "b": 3, "c": 10}


def test_a_unit_belongs_to_the_document_holding_most_of_its_targets():
    """Blocks of ``unit_size`` targets of each segment, numbered segment by segment (a short last unit where the
    size does not divide S); a tie goes to the earlier document."""
    target_docs = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1, 2, 2, 2, 2, 2, 3]])
    assert unit_documents(target_docs, 4) == [0, 1, 2, 2]  # [0 0 0 1] [1 1 1] | [1 2 2 2] [2 2 3]
    assert unit_documents(target_docs, 2) == [0, 0, 1, 1, 1, 2, 2, 3]  # [0 1]: a tie, the earlier one
    assert unit_documents(target_docs, 7) == [1, 2]
    assert unit_documents(torch.tensor([[3, 3, 2, 2]]), 4) == [2]  # ties go by the place in eval_documents
    with pytest.raises(ValueError, match="at least 1 target, got 0"):
        unit_documents(target_docs, 0)


def test_documents_in_order_numbers_documents_by_their_first_target():
    labels, places = documents_in_order(torch.tensor([[7, 7, 3], [3, 9, 9]]))
    assert labels == [7, 3, 9] and places.tolist() == [[0, 0, 1], [1, 2, 2]]


def test_each_unit_of_a_stream_names_the_document_holding_more_of_its_targets():
    """Stream targets 1..64 of the lettered corpus: a holds 1-10, b 11-51, c 52-64 (eval_documents' order)."""
    stream = EvalSet.for_run(eval_config("stream"), lettered_corpus())
    assert stream.scoring.unit == 16 and stream.unit_documents() == [0, 1, 1, 2]  # [a 10, b 6] ... [b 3, c 13]
    assert stream.unit_documents(8) == [0, 1, 1, 1, 1, 1, 2, 2]  # 9-16: a 2, b 6; 49-56: b 3, c 5
    assert stream.unit_documents(4)[2] == 0  # targets 9-12: a 2, b 2, a tie: the earlier document
    targets = torch.bincount(stream.target_docs.flatten()).tolist()
    assert targets == list(stream.documents.values()) == [10, 41, 13]  # each target's document, as the run counts
    letters = stream.segments[:, 1:]  # every target that is not a BOS is its document's letter
    names = list(stream.documents)
    assert all(ord(names[d]) == t for d, t in zip(stream.target_docs.flatten().tolist(), letters.flatten().tolist())
               if t != BOS)


def test_each_unit_of_document_bounded_windows_names_its_segment_s_document():
    evalset = EvalSet.for_run(eval_config("documents"), lettered_corpus())  # segments: b, c, c, d
    assert evalset.unit_documents() == [0, 1, 1, 2] and evalset.unit_documents(8) == [0, 0, 1, 1, 1, 1, 2, 2]
    assert torch.bincount(evalset.target_docs.flatten()).tolist() == list(evalset.documents.values())


def test_our_models_record_the_document_of_each_unit():
    """``evaluate_model``'s units carry ``doc``, one per unit, from the eval set."""
    from posenc_bench.bench.checkpoint import build_model
    from posenc_bench.bench.rows import Row
    from posenc_bench.bench.run.runtime import Runtime

    cfg = eval_config("stream")
    cfg.model.d_model, cfg.model.n_layers, cfg.model.n_heads = 16, 1, 2
    evalset = EvalSet.for_run(cfg, lettered_corpus())
    res = evaluate_model(build_model(cfg, Row("rope"), 0), evalset, 8, Runtime.create("cpu", "fp32"))
    assert res["units"]["doc"] == [0, 1, 1, 2] and len(res["units"]["nll"]) == 4
