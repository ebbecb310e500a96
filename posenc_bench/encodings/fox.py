"""FoX, the Forgetting Transformer: no position signal but a data-dependent forget gate per head and token,
whose cumulative log decays the attention logits (Lin et al., "Forgetting Transformer: Softmax Attention with a
Forget Gate", ICLR 2025, arXiv:2503.02130).

Forgetting Attention: each token t gets per head h a forget gate f_t = sigmoid(w_h . x_t + b_h) from the
attention layer's input x_t, and query i weighs key j <= i by

    softmax_j( q_i . k_j / sqrt(d) + sum_{l = j+1 .. i} log f_l ) = softmax_j( q_i . k_j / sqrt(d) + c_i - c_j ),

with c = cumsum(log f) along the tokens: a decay bias that is 0 at j = i, never positive, and learned from the
content, so the model decides per token how much older keys fade. As the authors' code
(zhixuan-lin/forgetting-transformer at 883f260) runs "FoX (LLaMA)", the paper's basic model:

- ``src/forgetting_transformer/model/forgetting_transformer/modeling_forgetting_transformer.py``,
  ``ForgettingAttentionLayer``: ``fgate_type="full"`` (the default): ``fgate_proj = nn.Linear(hidden_size,
  num_heads, bias=True)`` on the layer's ``hidden_states`` (the block's normalised input, which is what our
  ``for_tokens`` receives); ``log_fgate = logsigmoid(fgate_logit.float())``; no RoPE (``use_rope=False``), no
  output gate, no QK-norm, no token shift (all off in ``configs/model/forgetting_transformer.py``, the "Pro"
  variant turns them on and is not this row).
- Initialisation: ``_init_weights`` draws every Linear's weight from N(0, initializer_range = 0.02) and zeroes
  its bias (``fgate_bias_init=False`` with the full gate), so every gate starts near sigmoid(0) = 1/2.
- The decay bias is ``log_lambda[..., i] - log_lambda[..., j]`` with ``log_lambda = cumsum(log_fgate, -1)`` in
  float32 (the same function's ``output_attentions`` branch; ``ops/forgetting_attention.py``'s kernel computes
  the same in its tiles), scale 1 / sqrt(head_dim).

Each layer has its own gate (``for_layer``); the gate's weights are the encoding's parameters, drawn from its
own seed stream as every encoding's are. The attention runs on the model's explicit-logits path, chunk by
chunk (``model/explicit.py``); the authors' Triton kernel is a faster route to the same values on a GPU.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from posenc_bench.encodings.base import INIT_STD, TokenReading
from posenc_bench.encodings.registry import register


@register("fox")
class ForgettingAttention(TokenReading):
    """Per-layer forget gates, weight (n_layers, H, C) and bias (n_layers, H); the model asks each layer's view
    (``for_layer``, then ``for_tokens``) for that layer's decay."""

    summary = "FoX: a data-dependent forget gate per head and token decays the attention logits (no positions)"
    family = "contextual"
    paper = "Lin et al. 2025, ICLR (arXiv:2503.02130)"
    newer = True

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, n_layers: int = 1) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len)
        self.n_layers = n_layers
        self.gate_weight = nn.Parameter(torch.randn(n_layers, n_heads, d_model) * INIT_STD)  # (L, H, C)
        self.gate_bias = nn.Parameter(torch.zeros(n_layers, n_heads))  # (L, H): gates start near 1/2

    def log_gates(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """log f (B, H, T) in float32 of hidden states x (B, T, C) at attention layer ``layer``."""
        logit = x.float() @ self.gate_weight[layer].float().T + self.gate_bias[layer].float()  # (B, T, H)
        return F.logsigmoid(logit).transpose(1, 2)  # (B, T, H) -> (B, H, T)

    def read(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """The cumulative log gates c (B, H, T) of layer ``layer``'s hidden states x (B, T, C)."""
        return torch.cumsum(self.log_gates(x, layer), dim=-1)

    def logits_of(self, cum: torch.Tensor, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor,
                  k_pos: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
        return decay_logits(q, k, cum, q_pos, k_pos, mask, scale)


def decay_logits(q: torch.Tensor, k: torch.Tensor, cum: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                 mask: torch.Tensor, scale: float) -> torch.Tensor:
    """(B, H, q, k) float32 logits q . k * scale + mask + c_i - c_j of one query chunk, from the cumulative log
    gates ``cum`` (B, H, T) of the whole window, indexed by the chunk's token positions (q,), (k,)."""
    decay = cum[..., q_pos, None] - cum[..., None, k_pos]  # (B, H, q, k), <= 0 for j <= i
    return (q @ k.transpose(-1, -2)).float() * scale + decay + mask
