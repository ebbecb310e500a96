"""What ``posenc-bench time`` measures our code against: the machine's floor and the usual implementations.

- The floor: writing the output bytes, and one float32 sin per transcendental value a direct evaluation needs.
- The textbook sinusoidal table (the original Transformer tutorials' code) and transformers'
  ``LlamaRotaryEmbedding`` for the RoPE cache.
- transformers' ``LlamaForCausalLM`` sized like our model, for training throughput.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from posenc_bench.model.transformer import ModelConfig


def floor_fns(n_values: int, n_transcendentals: int, device) -> tuple[Callable, Callable]:
    """Write n_values float32 (allocate + fill), and n_transcendentals float32 sin of realistic angles."""
    angles = (torch.arange(n_transcendentals, device=device, dtype=torch.float32) % 8192) * 0.37
    out = torch.empty_like(angles)
    return (lambda: torch.empty(n_values, device=device).fill_(0.5)), (lambda: torch.sin(angles, out=out))


def textbook_sinusoidal(length: int, d_model: int, device=None) -> torch.Tensor:
    """The original Transformer tutorials' table: float32 angles, torch.zeros + strided sin/cos assignment."""
    pe = torch.zeros(length, d_model, device=device)
    position = torch.arange(0, length, dtype=torch.float, device=device).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2, device=device).float() * (-math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


def hf_rotary(head_dim: int, length: int, device) -> Callable[[], tuple]:
    """transformers' LlamaRotaryEmbedding building cos/sin for ``length`` positions."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=head_dim, num_attention_heads=1, head_dim=head_dim, max_position_embeddings=length)
    rotary = LlamaRotaryEmbedding(cfg).to(device)
    x = torch.empty(1, dtype=torch.float32, device=device)
    pos = torch.arange(length, device=device)[None]
    return lambda: rotary(x, pos)


def llama_like(cfg: ModelConfig, train_len: int):
    """transformers' LlamaForCausalLM sized like our model: same width, depth, heads, vocabulary, tied
    embeddings, no biases, SDPA attention, RoPE theta 10000. Its SwiGLU MLP has 3 matrices, so its inner
    size is 8/3 of the width (rounded down) to match our 2-matrix 4x GELU MLP in parameters and FLOPs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    theta = float(cfg.encoding_options.get("rope", {}).get("theta", 10000.0))
    lc = LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.mlp_ratio * cfg.d_model * 2 // 3,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_heads,
        max_position_embeddings=train_len, tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": theta}, use_cache=False,  # training: no KV cache
    )
    lc._attn_implementation = "sdpa"
    return LlamaForCausalLM(lc)
