"""A small decoder-only transformer (nanoGPT layout) that takes its position signal from an Encoding.

Reading order: config -> attention -> block -> model. The model calls the encoding's hooks and never asks
which encoding it has:
  positions(B, T) once per forward; embed(x, pos) once after the token embedding; rotate(q, k, pos) in every
  layer; bias(q_pos, k_pos) for the attention logits (shared by all layers, but for a layer view with
  ``own_positions``, planned from its own positions: ``+rand``'s per-layer draws); attention_logits(...) per query
  chunk for an encoding that computes the logits itself (``has_attention_logits``: CoPE, ReRoPE, Self-Extend);
  for_tokens(x) in every layer whose view reads the layer's input (``reads_tokens``: FoX's forget gates).
  An encoding with ``attention_sinks`` (StreamingLLM rows) gets the same hooks, called again for the queries'
  cache positions towards the sinks (``sinks.py``).
Attention runs along the forward's ``AttentionPlan`` (``plan.py``; ``attention.py`` runs it): the path
``choose_path`` picks once from the encoding's capabilities (SDPA's fused causal kernel, a bias folded into q/k
channels, chunked float masks, a learned distance bias's band gradient, or the encoding's own logits), in query
chunks, so memory stays bounded at long eval lengths.

Sliding-window attention (``window=W``; Beltagy et al., "Longformer", arXiv:2004.05150) lets query i see keys
j with i - W < j <= i; it composes with every encoding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from posenc_bench import encodings
from posenc_bench.errors import ConfigError
from posenc_bench.model.attention import attend
from posenc_bench.model.plan import MAX_MASK_BYTES, AttentionPlan


@dataclass
class ModelConfig:
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4
    vocab_size: int = 257  # 256 byte values + BOS (data.VOCAB_SIZE; the config checks it is at least that)
    # the embedding and output rows padded to a multiple of this (64 suits a GPU's matrix units); the padded
    # ids are never predicted (their logits are cut off) and their rows start at zero. 1: no padding
    vocab_multiple: int = 1
    # per-encoding keyword options, e.g. {"t5": {"num_buckets": 32}, "rope": {"theta": 10000.0}}
    encoding_options: dict = field(default_factory=dict)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, encoding: encodings.Encoding, plan: AttentionPlan) -> torch.Tensor:
        B, T, C = x.shape
        D = C // self.n_heads
        scale = 1.0 / math.sqrt(D)
        q, k, v = self.qkv(x).split(C, dim=2)
        if encoding.reads_tokens:  # a position signal computed from this layer's input (FoX's forget gates)
            encoding = encoding.for_tokens(x)
        # (B, T, C) -> (B, H, T, D)
        q, k, v = (t.view(B, T, self.n_heads, D).transpose(1, 2) for t in (q, k, v))
        y = attend(encoding, plan, q, k, v, scale)  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, H, T, D) -> (B, T, C)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, encoding: encodings.Encoding, plan: AttentionPlan) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), encoding, plan)
        return x + self.mlp(self.ln2(x))


class DecoderLM(nn.Module):
    """Token embedding -> encoding.embed -> n pre-LN blocks -> LayerNorm -> tied LM head."""

    def __init__(self, cfg: ModelConfig, encoding: str, train_len: int, *, window: Optional[int] = None,
                 seed: int = 0, max_mask_bytes: int = MAX_MASK_BYTES) -> None:
        super().__init__()
        validate_shape(cfg, encoding)
        self.cfg = cfg
        self.window = window
        self.max_mask_bytes = max_mask_bytes
        # Shared weights are drawn first from `seed`, so every encoding starts from the same core model;
        # the encoding's own parameters come from a separate stream that does not disturb it.
        torch.manual_seed(seed)
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # weight tying
        self._init_weights()
        self._pad_vocabulary()
        self._compiled: Optional[list] = None  # the blocks as torch.compile runs them (compile_blocks)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 1_000_003)
            self.encoding = build_encoding(cfg, encoding, train_len)
        self.encoding.set_window(window)  # for an encoding that counts the keys a query sees (+ssmax)

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = encodings.INIT_STD / math.sqrt(2 * self.cfg.n_layers) if name.endswith("proj.weight") else encodings.INIT_STD
                nn.init.normal_(p, mean=0.0, std=std)

    @property
    def padded_vocab(self) -> int:
        """Rows of the embedding and output matrix: vocab_size rounded up to a multiple of vocab_multiple."""
        return -(-self.cfg.vocab_size // self.cfg.vocab_multiple) * self.cfg.vocab_multiple

    def _pad_vocabulary(self) -> None:
        """Append the zero rows of the padded ids to the tied embedding/output matrix, after every weight was
        drawn: the real rows, and every later draw, are those of the unpadded model (the same RNG stream)."""
        extra = self.padded_vocab - self.cfg.vocab_size
        if not extra:
            return
        real = self.tok_emb.weight.data  # (V, C)
        weight = nn.Parameter(torch.cat((real, real.new_zeros(extra, real.shape[1]))))  # (V_pad, C)
        self.tok_emb.weight, self.tok_emb.num_embeddings = weight, weight.shape[0]
        self.lm_head.weight, self.lm_head.out_features = weight, weight.shape[0]

    def num_parameters(self) -> int:
        """Trainable numbers of the model as it predicts: each shared tensor once, the padded vocabulary rows
        (never used) not counted. What records report as a model's size."""
        padded = (self.padded_vocab - self.cfg.vocab_size) * self.cfg.d_model
        return sum(p.numel() for p in self.parameters()) - padded

    def compile_blocks(self, enabled: bool = True) -> None:
        """Run each block through ``torch.compile`` from the next forward on (``enabled``), or eagerly again.
        The positions' per-forward facts are worked out before the blocks (``forward``), so a block of the
        default encodings compiles into one graph; the state dict is unchanged either way."""
        self._compiled = [torch.compile(block) for block in self.blocks] if enabled else None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, T) token ids -> logits (B, T, vocab)."""
        B, T = idx.shape
        pos = self.encoding.positions(B, T, idx.device)  # (T,) 0 .. T-1, or (B, T) per sequence (+rand training)
        # asked once here, on the host, and memoized on pos: no layer syncs or breaks a compiled graph for it
        encodings.consecutive_start(pos)
        x = self.encoding.embed(self.tok_emb(idx), pos)  # (B, T, C)
        plans = {}  # by sliding window: one plan shared by the layers that attend alike, made when first used
        for i, block in enumerate(self._compiled or self.blocks):
            layer = self.encoding.for_layer(i)
            window = self.window if layer.own_window is None else layer.own_window  # a hybrid's layers differ
            if layer.own_positions:  # this layer's positions are its own (+rand's per-layer draws): its own plan
                layer_plan = AttentionPlan(layer, layer.positions(B, T, idx.device), window, self.max_mask_bytes,
                                           batch=B)
            else:
                if window not in plans:
                    plans[window] = AttentionPlan(self.encoding, pos, window, self.max_mask_bytes, batch=B)
                layer_plan = plans[window]
            x = block(x, layer, layer_plan)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V_pad)
        return logits[..., :self.cfg.vocab_size] if logits.shape[-1] != self.cfg.vocab_size else logits  # (B, T, V)


def encoding_options(all_options: dict, encoding: str) -> dict:
    """The options ``encoding`` is built with from ``model.encoding_options``: its trained encoding's (an eval-only
    variant inherits its base's), then its own."""
    trained_as = encodings.get_class(encoding).trained_as
    return {**all_options.get(trained_as, {}), **all_options.get(encoding, {})}


def build_encoding(cfg: ModelConfig, encoding: str, train_len: int) -> encodings.Encoding:
    """The encoding with its options from cfg.encoding_options (``encoding_options``)."""
    options = encoding_options(cfg.encoding_options, encoding)
    try:
        return encodings.build(encoding, d_model=cfg.d_model, n_heads=cfg.n_heads, train_len=train_len,
                               n_layers=cfg.n_layers, options=options)
    except ConfigError:
        raise
    except ValueError as e:  # an encoding's own shape check, e.g. RoPE on an odd head dimension
        raise ConfigError(f"encoding {encoding!r} cannot be built for this model: {e}") from None


def validate_shape(cfg: ModelConfig, encoding: str) -> None:
    """Raise ConfigError for shapes the model cannot take (or an unknown encoding), naming the value."""
    encodings.get_class(encoding)
    if cfg.d_model < 1 or cfg.n_heads < 1 or cfg.n_layers < 1:
        raise ConfigError(f"model.d_model, n_heads, n_layers must be >= 1, got {cfg.d_model}, {cfg.n_heads}, {cfg.n_layers}")
    if cfg.d_model % cfg.n_heads:
        divisors = [h for h in range(1, cfg.d_model + 1) if cfg.d_model % h == 0 and h <= 64]
        raise ConfigError(
            f"model.n_heads={cfg.n_heads} does not divide model.d_model={cfg.d_model}; "
            f"valid head counts: {', '.join(map(str, divisors))}"
        )
