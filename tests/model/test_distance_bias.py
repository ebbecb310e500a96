"""A learned bias's training path (model/distance_bias.py): the flash forward and its own backward equal
autograd through the whole (H, Tq, Tk) bias, in the output and in the gradients of q, k, v and of the bias,
whether it is a distance table r (band or tiled backward) or a per-pair mask, for any block size and any chunk
offset (queries from q_start, keys from k_start); and a model trained on it equals the same model on SDPA's
masked path (today's path where the kernel is missing), for every encoding that takes it."""

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.model import distance_bias, plan as attention_plan
from posenc_bench.model.plan import AttentionPlan
from posenc_bench.model.transformer import DecoderLM, ModelConfig

pytestmark = pytest.mark.skipif(not distance_bias.supported(torch.zeros(1)), reason="no CPU flash kernel in this torch")


def _chunk(q_start, k_start, Tq, seed, B=2, H=3, D=8):
    Tk = q_start + Tq - k_start  # keys [k_start, q_start + Tq)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=g, requires_grad=True) for n in (Tq, Tk, Tk))
    i = torch.arange(q_start, q_start + Tq)[:, None]
    j = torch.arange(k_start, q_start + Tq)[None, :]
    visible = (j <= i) & (j > i - 8)  # causal, a window of 8 keys
    return g, q, k, v, i, j, visible


def _textbook(q, k, v, mask):
    return torch.softmax((q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5 + mask, dim=-1) @ v


@pytest.mark.parametrize("rows", [1, 5, 64])  # query blocks of the band gradient and of the tiled backward
@pytest.mark.parametrize("W", [6, 40])  # a band (4 W <= keys: flash backward + band) or not (tiled)
@pytest.mark.parametrize("q_start,k_start", [(0, 0), (24, 10), (30, 27)])  # a chunk, its keys cut by a window
def test_distance_table_gradient_equals_autograd_through_the_whole_bias(monkeypatch, rows, W, q_start, k_start):
    monkeypatch.setattr(distance_bias, "ROWS", rows)
    monkeypatch.setattr(distance_bias, "BAND_ROWS", rows)
    g, q, k, v, i, j, visible = _chunk(q_start, k_start, 20, rows + q_start + W)
    H = q.shape[1]
    r = torch.randn(H, W + 1, generator=g, requires_grad=True)
    mask = r[:, (i - j).clamp(0, W)].masked_fill(~visible, float("-inf"))[None]  # (1, H, Tq, Tk)
    want = _textbook(q, k, v, mask)
    got = distance_bias.bias_attention(q, k, v, mask.detach(), q.shape[-1] ** -0.5, q_start, k_start, r=r)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    grad_out = torch.randn(want.shape, generator=g)
    grads_want = torch.autograd.grad(want, (q, k, v, r), grad_out)
    grads_got = torch.autograd.grad(got, (q, k, v, r), grad_out)
    for name, a, b in zip("qkvr", grads_got, grads_want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    assert grads_got[3][:, min(W, 7)].abs().sum() > 0  # the last distance a query sees gets its gradient


@pytest.mark.parametrize("rows", [3, 64])
@pytest.mark.parametrize("per_sequence", [False, True])  # one mask for the batch, or one per sequence (+rand)
@pytest.mark.parametrize("q_start,k_start", [(0, 0), (24, 10)])
def test_a_per_pair_bias_gets_its_gradient_through_the_mask(monkeypatch, rows, per_sequence, q_start, k_start):
    monkeypatch.setattr(distance_bias, "ROWS", rows)
    g, q, k, v, i, j, visible = _chunk(q_start, k_start, 20, rows + q_start)
    B, H = q.shape[:2]
    bias = torch.randn(B if per_sequence else 1, H, *visible.shape, generator=g, requires_grad=True)
    mask = bias.masked_fill(~visible, float("-inf"))
    want = _textbook(q, k, v, mask)
    got = distance_bias.bias_attention(q, k, v, mask, q.shape[-1] ** -0.5, q_start, k_start)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    grad_out = torch.randn(want.shape, generator=g)
    grads_want = torch.autograd.grad(want, (q, k, v, bias), grad_out, retain_graph=True)  # mask is shared
    grads_got = torch.autograd.grad(got, (q, k, v, bias), grad_out)
    for name, a, b in zip(("q", "k", "v", "bias"), grads_got, grads_want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    assert (grads_got[3][..., ~visible] == 0).all() and grads_got[3].abs().sum() > 0


def _step(model, x):
    loss = model(x).square().mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


@pytest.mark.parametrize("name,path", [("t5", "distance_bias"), ("kerple", "distance_bias"),
                                       ("kerple-power", "distance_bias"), ("fire", "bias_grad"),
                                       ("kerple+rand", "distance_bias"), ("kerple-power+rand", "distance_bias"),
                                       ("fire+rand", "bias_grad")])
@pytest.mark.parametrize("window,max_mask_bytes,bias_rows", [(None, 64 << 20, 512), (None, 4096, 48), (9, 64 << 20, 64)])
def test_training_on_the_bias_kernel_equals_sdpa_on_the_mask(monkeypatch, name, path, window, max_mask_bytes, bias_rows):
    """Every encoding whose training takes the kernel: the model's loss and every parameter's gradient equal
    those of the same model where the kernel is missing (SDPA with a mask that requires grad: the path these
    encodings trained on before), chunked or not, with a window, on (B, T) positions for ``+rand``."""
    monkeypatch.setattr(AttentionPlan, "BIAS_ROWS", bias_rows)
    monkeypatch.setattr(distance_bias, "ROWS", 16)
    T = 150
    model = DecoderLM(ModelConfig(d_model=32, n_layers=2, n_heads=4), name, 40, window=window, seed=3,
                      max_mask_bytes=max_mask_bytes)
    x = torch.randint(0, 256, (2, T), generator=torch.Generator().manual_seed(1))
    seen = []
    choose = attention_plan.choose_path
    monkeypatch.setattr(attention_plan, "choose_path", lambda e, f: seen.append(choose(e, f)) or seen[-1])
    draws = model.encoding.draws.clone() if hasattr(model.encoding, "draws") else None
    loss, grads = _step(model, x)
    assert seen and set(seen) == {path}
    if draws is not None:  # +rand: the same random positions again
        model.encoding.draws.copy_(draws)
    monkeypatch.setattr(distance_bias, "supported", lambda x: False)
    seen.clear()
    loss_ref, grads_ref = _step(model, x)
    assert set(seen) == {"mask"}
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-6)
    assert grads.keys() == grads_ref.keys()
    for n in grads:
        torch.testing.assert_close(grads[n], grads_ref[n], rtol=1e-4, atol=1e-6, msg=n)
    bias_params = [n for n in grads if n.startswith("encoding.")]
    assert bias_params and all(grads[n].abs().sum() > 0 for n in bias_params)


def test_the_kernel_path_is_training_only():
    enc = encodings.build("kerple", d_model=32, n_heads=4, train_len=40)
    with torch.no_grad():
        assert AttentionPlan(enc, torch.arange(100), None, 64 << 20).path == "mask"
    with torch.enable_grad():
        plan = AttentionPlan(enc, torch.arange(100), None, 64 << 20)
    assert plan.path == "distance_bias" and plan.distance_bias.shape == (4, 100)  # one value per distance


@pytest.mark.parametrize("rows", [3, 64])
def test_a_distance_table_on_per_sequence_positions_sums_dS_by_position_difference(monkeypatch, rows):
    """+rand: bias(i, j) = r[h, min(pos_i - pos_j, W)] with each sequence's own sorted positions; r's gradient is
    dS summed over the pairs whose positions are d apart (the distances past W in r[h, W])."""
    monkeypatch.setattr(distance_bias, "ROWS", rows)
    g, q, k, v, i, j, visible = _chunk(24, 10, 20, rows)
    B, H = q.shape[:2]
    W = 60
    k_pos = torch.stack([torch.randperm(200, generator=g)[:34].sort().values for _ in range(B)])  # keys: tokens 10-43
    q_pos = k_pos[:, 14:]  # queries: tokens 24-43
    r = torch.randn(H, W + 1, generator=g, requires_grad=True)
    distance = (q_pos[:, :, None] - k_pos[:, None, :]).clamp(0, W)  # (B, Tq, Tk)
    mask = r[:, distance].transpose(0, 1).masked_fill(~visible, float("-inf"))  # (B, H, Tq, Tk)
    want = _textbook(q, k, v, mask)
    got = distance_bias.bias_attention(q, k, v, mask.detach(), q.shape[-1] ** -0.5, 24, 10, r=r, positions=(q_pos, k_pos))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    grad_out = torch.randn(want.shape, generator=g)
    for name, a, b in zip("qkvr", torch.autograd.grad(got, (q, k, v, r), grad_out),
                          torch.autograd.grad(want, (q, k, v, r), grad_out)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
