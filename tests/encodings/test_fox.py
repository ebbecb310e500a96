"""FoX (encodings/fox.py) against Forgetting Attention's definition, written out pair by pair: query i weighs key
j <= i by softmax_j(q_i . k_j / sqrt(d) + sum_{l=j+1..i} log sigmoid(w . x_l + b)) (Lin et al. 2025; the
authors' ``ForgettingAttentionLayer``), with x the layer's normalised input."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from posenc_bench.encodings import build
from posenc_bench.model.transformer import DecoderLM, ModelConfig

CFG = ModelConfig(d_model=32, n_layers=2, n_heads=4)


def reference_forward(model, idx, window=None):
    """The model's forward (pre-LN blocks, tied head) in float64 with FoX's attention written out: each pair's
    decay is the sum of the log gates of the tokens after the key up to the query, summed term by term."""
    m = copy.deepcopy(model).double()
    B, T = idx.shape
    H, C = m.cfg.n_heads, m.cfg.d_model
    D = C // H
    x = m.tok_emb(idx)
    for layer, block in enumerate(m.blocks):
        h = block.ln1(x)
        q, k, v = block.attn.qkv(h).split(C, dim=2)
        log_f = F.logsigmoid(h @ m.encoding.gate_weight[layer].T + m.encoding.gate_bias[layer])  # (B, T, H)
        y = torch.zeros(B, T, C, dtype=torch.float64)
        for b in range(B):
            for hd in range(H):
                sl = slice(hd * D, (hd + 1) * D)
                logits = torch.full((T, T), float("-inf"), dtype=torch.float64)
                for i in range(T):
                    for j in range(i + 1):
                        if window is not None and j <= i - window:
                            continue
                        decay = sum((log_f[b, t, hd] for t in range(j + 1, i + 1)), torch.tensor(0.0, dtype=torch.float64))
                        logits[i, j] = q[b, i, sl] @ k[b, j, sl] / math.sqrt(D) + decay
                y[b, :, sl] = torch.softmax(logits, -1) @ v[b, :, sl]
        x = x + block.attn.proj(y)
        x = x + block.mlp(block.ln2(x))
    return m.lm_head(m.ln_f(x))


def fox_model(window=None, max_mask_bytes=None, seed=0):
    extra = {} if max_mask_bytes is None else {"max_mask_bytes": max_mask_bytes}
    model = DecoderLM(CFG, "fox", 16, seed=seed, window=window, **extra).eval()
    with torch.no_grad():  # gates far from 1/2 and different per layer and head, so the test sees each one
        model.encoding.gate_bias.copy_(torch.randn(2, 4, generator=torch.Generator().manual_seed(7)) * 2)
        model.encoding.gate_weight.mul_(20)
    return model


@pytest.mark.parametrize("window,chunked", [(None, False), (None, True), (6, True)])
def test_whole_model_equals_forgetting_attention_pair_by_pair(window, chunked):
    """Beyond the train length (20 > 16), in one chunk and in query chunks of 2-3 rows (each chunk's decay taken
    at its own tokens), with and without a sliding window."""
    model = fox_model(window, 4 * 4 * 20 * 8 * 3 if chunked else None)
    idx = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, want = model(idx).double(), reference_forward(model, idx, window)
    assert (got - want).abs().max() < 2e-4


def test_gates_at_one_are_nope_and_a_closing_gate_forgets_everything_before_it():
    """f = 1 everywhere removes the decay: the model is NoPE's on the same shared weights. A gate of 0 at token t
    (log f = -1e4: exp underflows to 0) cuts every later query off from the keys before t: changing those tokens cannot move it."""
    fox, nope = DecoderLM(CFG, "fox", 16, seed=1).eval(), DecoderLM(CFG, "nope", 16, seed=1).eval()
    idx = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        fox.encoding.gate_weight.zero_()
        fox.encoding.gate_bias.fill_(40.0)  # log sigmoid(40) = -4e-18
        assert torch.allclose(fox(idx), nope(idx), atol=1e-6)
    fox = fox_model()
    cut = 10
    with torch.no_grad():  # every gate open but token `cut`'s, which the gate reads from its (unique) byte
        fox.encoding.gate_weight.zero_()
        fox.encoding.gate_bias.fill_(40.0)
        idx[0, cut] = 7
        idx[0, :cut] = torch.where(idx[0, :cut] == 7, 8, idx[0, :cut])
        gate = fox.encoding.log_gates  # wrap: the gate of byte 7's hidden state is shut in every layer and head

        def shut(x, layer, _gate=gate, _idx=idx):
            out = _gate(x, layer).clone()
            out[..., cut] = -1e4
            return out

        fox.encoding.log_gates = shut
        before = fox(idx)
        other = idx.clone()
        other[0, :cut] = (other[0, :cut] + 1) % 7  # bytes 0-6: never 7
        after = fox(other)
    assert torch.equal(before[0, cut:], after[0, cut:])
    assert not torch.allclose(before[0, :cut], after[0, :cut])


def test_each_layer_reads_its_own_gate_and_the_decay_is_never_positive():
    model = fox_model()
    idx = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = model(idx)
        model.encoding.gate_bias.copy_(model.encoding.gate_bias.flip(0))
        model.encoding.gate_weight.copy_(model.encoding.gate_weight.flip(0))
        assert not torch.allclose(before, model(idx), atol=1e-4)
        view = model.encoding.for_layer(1).for_tokens(torch.randn(1, 16, 32))
        decay = view.attention_logits(torch.zeros(1, 4, 16, 8), torch.zeros(1, 4, 16, 8), torch.arange(16),
                                      torch.arange(16), torch.zeros(1, 1, 16, 16), 1.0)
    lower = torch.tril(torch.ones(16, 16, dtype=torch.bool))
    assert (decay[..., lower] <= 0).all() and torch.equal(decay.diagonal(dim1=-2, dim2=-1), torch.zeros(1, 4, 16))
    with pytest.raises(ValueError, match="layers 0..1"):
        model.encoding.for_layer(2)
    with pytest.raises(RuntimeError, match="for_tokens"):
        model.encoding.attention_logits(None, None, None, None, None, 1.0)


def test_initialised_as_the_authors_and_trained_gates_reload():
    """Weights N(0, 0.02) and biases 0 (``_init_weights``, ``fgate_bias_init=False``): every gate starts near 1/2.
    One training step moves both; the checkpoint reloads to the same outputs."""
    enc = build("fox", d_model=64, n_heads=4, train_len=16, n_layers=3)
    assert enc.gate_weight.shape == (3, 4, 64) and torch.equal(enc.gate_bias, torch.zeros(3, 4))
    assert abs(enc.gate_weight.std().item() - 0.02) < 0.002
    model = DecoderLM(CFG, "fox", 16, seed=0)
    idx = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(1))
    loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    assert model.encoding.gate_weight.grad.abs().sum() > 0 and model.encoding.gate_bias.grad.abs().sum() > 0
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    again = DecoderLM(CFG, "fox", 16, seed=5)
    again.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(model.eval()(idx), again.eval()(idx))
