"""Key tokens (bench/eval/key_tokens.py): the rule on hand-made NLL pairs, its alpha / beta edges, no key tokens at
1x, the short pass's contexts, the folder's cache and its hash, the key sums the evaluation writes per unit, and
agreement with the authors' package (``longppl`` 0.3.0: ``find_key_token``, ``cal_overlap``, ``compute_longppl``)
on a tiny Llama."""

import math

import pytest
import torch

from posenc_bench import metrics
from posenc_bench.bench.eval.evaluate import Scoring, Targets, logits_nll, score_windows
from posenc_bench.bench.eval.key_tokens import (KeyTokenRule, KeyTokens, as_segments, candidates, key_mask,
                                                target_nll)
from posenc_bench.errors import ConfigError


def test_the_key_set_of_a_known_nll_pair():
    # targets:      0     1     2     3     4
    long = torch.tensor([0.5, 1.0, 0.1, 2.5, 1.9])
    short = torch.tensor([3.0, 2.9, 2.2, 5.0, 1.0])
    # drops:        2.5   1.9   2.1   2.5  -0.9 ; log-prob: -0.5 -1.0 -0.1 -2.5 -1.9
    assert key_mask(long, short).tolist() == [True, False, True, False, False]  # 3: log-prob -2.5 below beta
    assert key_mask(long, short, alpha=1.8).tolist() == [True, True, True, False, False]
    assert key_mask(long, short, beta=-3.0).tolist() == [True, False, True, True, False]


def test_alpha_and_beta_are_strict_as_the_packages():
    long, short = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.5])  # drops 2.0 and 2.5; log-probs -1 and -2
    assert key_mask(long, short).tolist() == [False, False]  # a drop of exactly alpha, a log-prob of exactly beta
    assert key_mask(long, short, alpha=1.999, beta=-2.001).tolist() == [True, True]


def test_only_targets_with_more_context_than_the_train_length_and_the_short_pass_are_candidates():
    long_ctx = torch.tensor([[4, 5, 6, 7]])
    short_ctx = torch.tensor([[4, 4, 4, 7]])
    assert candidates(long_ctx, short_ctx, train_len=4).tolist() == [[False, True, True, False]]
    assert not candidates(long_ctx, long_ctx, train_len=4).any()


def test_as_segments_puts_the_mask_on_the_predicted_tokens():
    assert as_segments(torch.tensor([[True, False]])).tolist() == [[False, True, False]]


def test_the_rules_short_windows_and_bad_values():
    assert KeyTokenRule("rope").short_windows(64) == (64, 16)  # ours: 49 .. 64 tokens of context
    assert KeyTokenRule("rope", short_context="longppl", stride=16).short_windows(64) == (79, 16)  # 64 .. 79
    assert KeyTokenRule("rope", stride=100).short_windows(64) == (64, 64)
    d = KeyTokenRule("rope", stride=8).describe(64)
    assert (d["evaluator"], d["alpha"], d["beta"], d["short_window"], d["short_stride"]) == ("rope", 2.0, -2.0, 64, 8)
    with pytest.raises(ConfigError, match="valid: train, longppl"):
        KeyTokenRule("rope", short_context="short")
    with pytest.raises(ConfigError, match="stride must be >= 1"):
        KeyTokenRule("rope", stride=0)
    with pytest.raises(ConfigError, match="evaluator"):
        KeyTokenRule("")


def _toy_nll(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A model whose NLL of each target is 3 / (tokens of context): more context, lower NLL."""
    return (3.0 / torch.arange(1, x.shape[1] + 1, dtype=torch.float64)).expand(x.shape[0], -1)


def test_target_nll_gives_each_target_its_context():
    seg = torch.zeros(2, 13, dtype=torch.long)  # S = 12 targets
    nll, ctx = target_nll(_toy_nll, seg, 4, 2)  # first window 1..4, then 3..4 tokens of context
    assert ctx[0].tolist() == [1, 2, 3, 4, 3, 4, 3, 4, 3, 4, 3, 4]
    assert torch.allclose(nll, 3.0 / ctx.double())
    nll, ctx = target_nll(_toy_nll, seg, 6)
    assert ctx[1].tolist() == [1, 2, 3, 4, 5, 6] * 2


def test_no_key_tokens_at_1x_and_the_toys_keys_at_3x():
    seg = torch.zeros(1, 13, dtype=torch.long)
    calls = []

    def nll_at(length, stride):
        calls.append((length, stride))
        return target_nll(_toy_nll, seg, length, stride)

    keys = KeyTokens(KeyTokenRule("toy", alpha=0.3, beta=-1.0, stride=4), 4, nll_at)
    assert keys.at(4) is None and not calls  # at the train length nothing is computed
    mask = keys.at(12)  # one window: contexts c = 1..12; short (4, stride 4): s = 1..4, 1..4, 1..4
    # candidates c > 4; drop 3/s - 3/c > 0.3 (smallest at c = 8, s = 4: 0.375) and log-prob -3/c > -1: c 5..12
    assert mask[0].tolist() == [False] * 5 + [True] * 8  # token 0 is context only
    assert calls == [(4, 4), (12, None)]
    keys = KeyTokens(KeyTokenRule("toy", alpha=0.45, beta=-1.0, stride=4), 4, nll_at,
                     target_mask=torch.tensor([[True] * 12 + [False]]))
    # alpha 0.45 drops c = 8 (0.375); the last token is context only, never key
    assert keys.at(12)[0].tolist() == [False] * 5 + [True, True, True, False] + [True] * 3 + [False]


def test_kept_key_tokens_are_reused_for_the_same_ident_and_found_again_for_another(tmp_path):
    from posenc_bench.bench.eval.key_tokens import KeyTokenFile

    path = tmp_path / "key_tokens.pt"
    first = KeyTokenFile(path, {"alpha": 2.0, "evaluator_model": "abc"})
    assert first.masks == {} and first.short is None  # no file yet
    first.masks[64] = torch.tensor([[False, True, True]])
    first.save()
    again = KeyTokenFile(path, {"evaluator_model": "abc", "alpha": 2.0})  # the same ident, in any order: read back
    assert list(again.masks) == [64] and torch.equal(again.masks[64], first.masks[64])
    other = KeyTokenFile(path, {"alpha": 1.0, "evaluator_model": "abc"})
    assert other.masks == {}  # another rule or evaluator: nothing reused
    assert KeyTokenFile(path, {"alpha": 2.0, "evaluator_model": "abc"}, read=False).masks == {}  # --fresh
    assert [p.name for p in tmp_path.iterdir()] == ["key_tokens.pt"]  # written atomically: no temporary left


def test_a_damaged_key_token_file_is_refused_with_its_path(tmp_path):
    from posenc_bench.bench.eval.key_tokens import KeyTokenFile
    from posenc_bench.errors import PosencError

    path = tmp_path / "key_tokens.pt"
    path.write_bytes(b"not a torch file")
    with pytest.raises(PosencError, match="key_tokens.pt: not a key-token file.*delete it"):
        KeyTokenFile(path, {"alpha": 2.0})


def test_an_interrupted_evaluator_resumes_at_its_next_pass(tmp_path):
    """Each pass is kept as it ends: stopped during the long pass at 3x, a new KeyTokens on the same file takes the
    short pass and the mask at 2x from it and runs only the 3x pass, to the masks of a run never stopped."""
    from posenc_bench.bench.eval.key_tokens import KeyTokenFile

    seg, calls, rule = torch.zeros(1, 13, dtype=torch.long), [], KeyTokenRule("toy", alpha=0.3, beta=-1.0, stride=4)

    def nll_at(length, stride):
        calls.append((length, stride))
        if stop and length == 12:
            raise KeyboardInterrupt
        return target_nll(_toy_nll, seg, length, stride)

    stop = False
    whole = KeyTokens(rule, 4, nll_at)  # in memory: no file
    expected = {L: whole.at(L) for L in (8, 12)}
    path, ident, stop = tmp_path / "key_tokens.pt", {"rule": "toy"}, True
    calls.clear()
    stopped = KeyTokens(rule, 4, nll_at, store=KeyTokenFile(path, ident))
    assert torch.equal(stopped.at(8), expected[8])
    with pytest.raises(KeyboardInterrupt):
        stopped.at(12)
    assert calls == [(4, 4), (8, None), (12, None)]
    stop = False
    calls.clear()
    resumed = KeyTokens(rule, 4, nll_at, store=KeyTokenFile(path, ident))
    assert all(torch.equal(resumed.at(L), expected[L]) for L in (8, 12)) and calls == [(12, None)]
    calls.clear()
    again = KeyTokens(rule, 4, nll_at, store=KeyTokenFile(path, ident))
    assert torch.equal(again.at(12), expected[12]) and calls == []  # every pass kept: none run


def test_the_evaluation_sums_key_nll_and_key_tokens_per_unit_and_longppl_is_exp_of_their_ratio():
    seg = torch.zeros(2, 9, dtype=torch.long)  # S = 8
    key = torch.zeros(2, 9, dtype=torch.bool)
    key[0, [3, 8]] = True  # targets with 3 and 8 tokens of context (windows of 8): NLL 1.0 and 0.375
    key[1, 6] = True  # 6 tokens: NLL 0.5
    res = score_windows(_toy_nll, seg, 8, Scoring(buckets=2, unit=4), targets=Targets(key=key))
    units = res["units"]
    assert units["key_tokens"] == [1, 1, 0, 1]
    assert units["key_nll"] == pytest.approx([1.0, 0.375, 0.0, 0.5])
    assert metrics.get("longppl").of_units(units) == pytest.approx(math.exp((1.0 + 0.375 + 0.5) / 3))
    assert metrics.get("key_share").of_units(units) == pytest.approx(3 / 16)
    assert "key_nll" not in score_windows(_toy_nll, seg, 8, Scoring(buckets=2, unit=4))["units"]


# ---- a tiny Llama: our short pass by brute force, and the authors' package --------------------------------

T, W, N_TOKENS = 64, 16, 64 + 16 * 8  # trunc_len, sliding_window, text tokens: (N - T) a multiple of W


def _llama(tokenizer, seed):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T,
                      tie_word_embeddings=False, initializer_range=0.3)
    return LlamaForCausalLM(cfg).double().eval()  # float64: no threshold decided by rounding


@pytest.fixture(scope="module")
def tiny(tokenizer):
    """(text, its N_TOKENS token ids (1, N), the evaluator, the evaluated model): random tiny Llamas in float64
    (their NLL moves by several nats with context, so a key set exists at alpha = 2 with a lower beta)."""
    import sysconfig
    from pathlib import Path

    source = (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text()
    ids = tokenizer(source, add_special_tokens=False, return_offsets_mapping=True)
    text = source[: ids["offset_mapping"][N_TOKENS - 1][1]]  # exactly N_TOKENS tokens
    tokens = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])[None]
    assert tokens.shape[1] == N_TOKENS
    return text, tokens, _llama(tokenizer, 0), _llama(tokenizer, 1)


def _nll_fn(model):
    return logits_nll(lambda x: model(x).logits)


def test_ours_short_context_is_the_last_train_length_tokens_with_stride_1(tiny):
    _, tokens, evaluator, _ = tiny
    seg = tokens[:, :T + 9]
    nll, ctx = target_nll(_nll_fn(evaluator), seg, *KeyTokenRule("e", stride=1).short_windows(T))
    for j in (T + 1, T + 4, T + 8):  # target j (token j) with exactly its last T tokens
        with torch.no_grad():
            direct = _nll_fn(evaluator)(seg[:, j - T : j], seg[:, j - T + 1 : j + 1])[0, -1]
        assert ctx[0, j - 1] == T and float(nll[0, j - 1]) == pytest.approx(float(direct), abs=1e-10)


@pytest.mark.parametrize("alpha, beta", [(2.0, -7.0)])
def test_key_tokens_and_longppl_agree_with_the_longppl_package(tiny, tokenizer, alpha, beta):
    lp = pytest.importorskip("longppl.longppl", reason="the authors' package longppl is not installed "
                                                       "(pip install longppl==0.3.0: the test extra has it)")
    text, tokens, evaluator, model = tiny
    # the package: its key tokens (indices into the evaluated model's losses, target i - 1 predicting token i)
    slices = lp.find_key_token(text, evaluator, tokenizer, T, W, None, alpha, beta)
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    theirs = lp.cal_overlap(offsets, slices)
    got = lp.compute_longppl(text, model, evaluator, tokenizer, tokenizer, trunc_len=T, sliding_window=W,
                             alpha=alpha, beta=beta)
    # ours, with the package's short pass (longppl: T .. T + W - 1 tokens) and the whole text as one window
    rule = KeyTokenRule("evaluator", alpha, beta, short_context="longppl", stride=W)
    keys = KeyTokens(rule, T, lambda length, stride: target_nll(_nll_fn(evaluator), tokens, length, stride))
    mask = keys.at(N_TOKENS - 1)  # (1, N): token i is key
    ours = (mask[0].nonzero().flatten() - 1).tolist()
    assert 3 < len(ours) < N_TOKENS - T - W and ours == theirs and got["n_key_token"] == len(ours)
    res = score_windows(_nll_fn(model), tokens, N_TOKENS - 1, Scoring(unit=N_TOKENS - 1), targets=Targets(key=mask))
    assert metrics.get("longppl").of_units(res["units"]) == pytest.approx(float(got["longppl"]), rel=1e-3)
    assert res["ppl"] == pytest.approx(float(got["ppl"]), rel=1e-3)
