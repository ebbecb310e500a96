import math

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.encodings import INIT_STD
from posenc_bench.encodings.absolute import Learned, Sinusoidal, rows, sinusoidal_table
from posenc_bench.errors import PositionOutOfRange


def test_sinusoidal_is_the_original_formula():
    table = sinusoidal_table(60, 16)
    for pos in (0, 1, 7, 59):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-7)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-7)


def test_sinusoidal_is_accurate_at_long_positions():
    """Within float32 rounding of a float64 reference at position 5000 (float32 angles miss by ~4e-4)."""
    table = sinusoidal_table(5001, 512)
    pos = torch.arange(5001, dtype=torch.float64)[:, None]
    inv = torch.tensor([10000 ** (-2 * i / 512) for i in range(256)], dtype=torch.float64)
    ref = torch.stack(((pos * inv).sin(), (pos * inv).cos()), -1).reshape(5001, 512)
    assert (table.double() - ref).abs().max() < 1e-6


def test_sinusoidal_embed_adds_the_table_and_extends_past_train_len():
    enc = Sinusoidal(d_model=16, n_heads=2, train_len=8)
    x = torch.zeros(2, 30, 16)
    out = enc.embed(x, torch.arange(30))
    assert torch.equal(out[1], sinusoidal_table(30, 16) * INIT_STD)
    x = torch.ones(1, 3, 16)
    assert torch.allclose(enc.embed(x, torch.arange(3)), 1.0 + INIT_STD * sinusoidal_table(3, 16))  # x + PE * 0.02
    literal = Sinusoidal(d_model=16, n_heads=2, train_len=8, token_scale=0, pe_scale=1)  # the paper's x sqrt(d) + PE
    assert torch.allclose(literal.embed(x, torch.arange(3)), 4.0 + sinusoidal_table(3, 16))


def test_sinusoidal_default_keeps_the_papers_token_to_position_ratio_at_the_shared_init():
    """Vaswani et al. with tensor2tensor's init: tokens at RMS 1 (std d^-0.5 x sqrt(d)) beside the table's
    1/sqrt(2). Here every embedding starts at std INIT_STD (the model's own init), and the table is scaled to
    keep the ratio; the model's token embeddings really start at that std."""
    from posenc_bench.model.transformer import DecoderLM, ModelConfig

    d = 128
    model = DecoderLM(ModelConfig(d_model=d), "sinusoidal", 64, seed=0)
    tok_rms = model.tok_emb.weight.pow(2).mean().sqrt().item()
    pe_rms = (model.encoding.embed(torch.zeros(1, 64, d), torch.arange(64))).pow(2).mean().sqrt().item()
    assert tok_rms == pytest.approx(INIT_STD, rel=0.02)
    assert tok_rms / pe_rms == pytest.approx(math.sqrt(2), rel=0.02)  # the paper's 1 : 1/sqrt(2)
    assert Sinusoidal.key_options(64, {}) == {"token_scale": 1.0, "pe_scale": INIT_STD}  # not the old models' key


def test_learned_table_raises_named_error_past_its_length():
    enc = Learned(d_model=16, n_heads=2, train_len=8)
    enc.set_eval_length(8)
    assert enc.embed(torch.zeros(1, 8, 16), torch.arange(8)).shape == (1, 8, 16)
    with pytest.raises(PositionOutOfRange, match="8 rows"):
        enc.set_eval_length(9)
    with pytest.raises(PositionOutOfRange):
        enc.embed(torch.zeros(1, 9, 16), torch.arange(9))


def textbook_table(length, d_model):
    """The original tutorials' version: float32 angles, one sin/cos per element, strided assignment."""
    pe = torch.zeros(length, d_model)
    position = torch.arange(0, length, dtype=torch.float).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


def test_sinusoidal_is_more_accurate_than_the_textbook_version():
    pos = torch.arange(5000, dtype=torch.float64)[:, None]
    inv = 10000 ** (-torch.arange(0, 512, 2, dtype=torch.float64) / 512)
    ref = torch.stack(((pos * inv).sin(), (pos * inv).cos()), -1).reshape(5000, 512)
    ours = (sinusoidal_table(5000, 512).double() - ref).abs().max()
    textbook = (textbook_table(5000, 512).double() - ref).abs().max()
    assert ours < 1e-6 < 1e-4 < textbook  # the textbook's float32 angles: ~4e-4 at position 5000


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_sinusoidal_on_cuda_equals_cpu():
    gpu = sinusoidal_table(3000, 256, device="cuda")
    assert gpu.device.type == "cuda"
    assert (gpu.cpu() - sinusoidal_table(3000, 256)).abs().max() < 3e-7


@pytest.mark.parametrize("pos,view", [
    (torch.arange(3, 9), True),  # what the model passes: a slice of the table, no copy
    (torch.arange(0, 12), True),
    (torch.tensor([4, 2, 7]), False),  # anything else is gathered
    (torch.tensor([1, 2, 4]), False),
    (torch.tensor([], dtype=torch.long), False),
])
def test_table_rows_are_a_view_for_consecutive_positions_and_equal_the_gather(pos, view):
    table = torch.randn(12, 4)
    got = rows(table, pos)
    assert torch.equal(got, table[pos])
    assert (got.numel() > 0 and got.data_ptr() == table[int(pos[0])].data_ptr()) == view


@pytest.mark.parametrize("name", ["learned", "sinusoidal"])
def test_absolute_embed_at_any_positions_equals_the_gathered_table(name):
    enc = encodings.build(name, d_model=8, n_heads=2, train_len=16)
    x = torch.randn(2, 5, 8)
    for pos in (torch.arange(5), torch.arange(7, 12), torch.tensor([9, 0, 3, 3, 15])):
        got = enc.embed(x, pos)
        if name == "learned":
            expected = x + enc.table[pos]
        else:
            expected = x * enc.scale + sinusoidal_table(16, 8)[pos] * enc.pe_scale
        assert torch.equal(got, expected)
