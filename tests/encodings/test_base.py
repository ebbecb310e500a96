"""The base class: every hook defaults to doing nothing and every capability to off (so a new encoding changes
only what it overrides), ``consecutive_start``, and the family names."""

import pytest
import torch

from posenc_bench.encodings import FAMILIES, Encoding, consecutive_start

CAPABILITIES = ("has_bias", "has_low_rank_bias", "has_distance_bias", "has_attention_logits", "has_attention_parts",
                "batched_positions", "positions_in_embedding", "finetuned", "newer")


def test_the_base_hooks_leave_the_model_as_it_is():
    enc = Encoding(d_model=8, n_heads=2, train_len=16)
    assert (enc.head_dim, enc.n_heads, enc.train_len) == (4, 2, 16)
    pos = enc.positions(3, 5, torch.device("cpu"))
    assert torch.equal(pos, torch.arange(5))  # (T,): every sequence at 0 .. T-1
    g = torch.Generator().manual_seed(0)
    x, q, k = torch.randn(3, 5, 8, generator=g), torch.randn(3, 2, 5, 4, generator=g), torch.randn(3, 2, 5, 4, generator=g)
    assert enc.embed(x, pos) is x
    rq, rk = enc.rotate(q, k, pos)
    assert rq is q and rk is k
    assert enc.bias(pos, pos) is None and enc.bias_factors(pos, pos) is None and enc.distance_bias(5) is None
    assert enc.attention_block(64) is None and enc.key_options(16, {"theta": 1.0}) == {}
    mask = torch.zeros(1, 1, 5, 5).masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(enc.attention_logits(q, k, pos, pos, mask, 0.5), (q @ k.transpose(-1, -2)) * 0.5 + mask)
    with pytest.raises(NotImplementedError):
        enc.attention_parts(q, k, pos, pos)


def test_the_base_declares_no_capability_no_sinks_and_no_family():
    assert not any(getattr(Encoding, flag) for flag in CAPABILITIES)
    assert Encoding.attention_sinks is None and Encoding.trained_as is None
    assert Encoding.family == "" and Encoding.family not in FAMILIES  # every class must declare its own
    assert Encoding.tuning_grid(32, 128, {}) == []  # nothing to tune unless a class declares a grid
    assert Encoding.tuned_row({"window": 4}) == ("", {"window": 4})  # a point is its own options


@pytest.mark.parametrize("pos,start", [
    (torch.arange(5), 0), (torch.arange(3, 9), 3), (torch.tensor([7]), 7),
    (torch.tensor([0, 2, 3]), None), (torch.tensor([3, 2, 1]), None),
    (torch.arange(6).view(2, 3), None),  # per-sequence positions: gathered
    (torch.arange(0), None),
])
def test_consecutive_start_is_the_first_position_of_a_run_only(pos, start):
    assert consecutive_start(pos) == start


def test_the_family_names_are_distinct():
    assert len(set(FAMILIES)) == len(FAMILIES) and all(f and f == f.strip() for f in FAMILIES)


def test_consecutive_start_is_worked_out_once_per_tensor(monkeypatch):
    """The memo on the tensor: a second ask reads no value (no host sync); a slice is a new tensor, asked
    afresh; the memo holds "not consecutive" too, and works on inference tensors (evaluation's)."""
    pos, other = torch.arange(2, 10), torch.tensor([0, 2, 3])
    assert consecutive_start(pos) == 2 and consecutive_start(other) is None
    monkeypatch.setattr(torch, "equal", lambda *a: pytest.fail("read the values again"))
    assert consecutive_start(pos) == 2 and consecutive_start(other) is None
    monkeypatch.undo()
    assert consecutive_start(pos[3:]) == 5 and consecutive_start(other[1:]) == 2
    with torch.inference_mode():
        assert consecutive_start(torch.arange(4)) == 0


def _declaring(flag: str) -> list[str]:
    from posenc_bench import encodings
    return [n for n in encodings.trained() if getattr(encodings.get_class(n), flag) and "+" not in n]


@pytest.mark.parametrize("name", _declaring("distance_only"))
def test_a_distance_only_bias_is_a_function_of_i_minus_j(name):
    """What ``distance_only`` promises (``+rand`` draws distances for it): shifting queries and keys together
    leaves the bias as it is, on consecutive and on scattered positions."""
    from posenc_bench import encodings
    torch.manual_seed(0)
    enc = encodings.build(name, d_model=16, n_heads=2, train_len=64)
    with torch.no_grad():
        for raw in (torch.arange(40), torch.tensor([0, 3, 4, 9, 17, 18, 30, 55])):
            base = enc.bias(raw, raw)
            for shift in (1, 37, 500):
                shifted = enc.bias(raw + shift, raw + shift)
                visible = (raw[:, None] >= raw[None, :]).expand_as(base)
                assert torch.allclose(shifted[visible], base[visible], atol=1e-6), (name, shift)


def test_the_distance_only_rows_are_those_with_a_bias_of_the_distance():
    assert set(_declaring("distance_only")) == {"alibi", "t5", "kerple", "kerple-power"}  # not FIRE: psi(max(i, L))
