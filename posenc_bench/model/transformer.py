"""A small decoder-only transformer (nanoGPT layout) that takes its position signal from an Encoding.

Reading order: config -> attention -> block -> model. The model calls the encoding's three hooks and never
asks which encoding it has:
  embed(x, pos) once after the token embedding; rotate(q, k, pos) in every layer; bias(q_pos, k_pos) for the
  attention logits (shared by all layers).
Attention is ``F.scaled_dot_product_attention``: on its fused causal path (``is_causal=True``) when the
encoding has no bias and there is no sliding window; a bias that is low-rank up to per-row constants (ALiBi,
``has_low_rank_bias``) is folded into extra q/k channels and stays on the fused kernels; any other bias or a
window becomes a 4-D (1, H, Tq, Tk) float mask (a 3-D mask sends SDPA to its slow math path), built for chunks
of queries so that memory stays bounded at long eval lengths instead of needing a full (H, L, L) tensor per
layer. A learned distance bias (T5, ``has_distance_bias``) trains through ``distance_bias.py`` on CPU, which
keeps the flash kernel where SDPA would fall back to its math path for a mask that requires grad.

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
from posenc_bench.model import distance_bias
from posenc_bench.errors import ConfigError


@dataclass
class ModelConfig:
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4
    vocab_size: int = 257  # 256 byte values + BOS (data.VOCAB_SIZE; the config checks it is at least that)
    # per-encoding keyword options, e.g. {"t5": {"num_buckets": 32}, "rope": {"theta": 10000.0}}
    encoding_options: dict = field(default_factory=dict)


class AttentionPlan:
    """How one forward pass at length T runs attention: query chunks and their masks, shared by all layers.

    Three ways, chosen from the encoding's capabilities (never its name):
    - fused: no bias, no window: one SDPA call on the fused causal path (``is_causal=True``).
    - low-rank bias (``encoding.has_low_rank_bias``, e.g. ALiBi): the bias is folded into extra q/k channels
      (``fold_bias``), so no (Tq, Tk) bias exists and SDPA stays on its fused kernels; queries come in chunks
      of at most ``FOLD_ROWS`` so the folded values stay small (float precision). The first chunk is square and
      causal; later ones get a causal (and window) mask without any bias.
    - mask: a 4-D (1, H or 1, q, k) float mask holding the bias and the causal/window -inf entries. In training
      on CPU a learned distance bias (``encoding.has_distance_bias``, e.g. T5) goes through
      ``distance_bias.distance_bias_attention`` (flash kernel + band gradient) in chunks of ``BIAS_ROWS`` queries,
      from ``BAND_MIN`` x its band width on (shorter sequences are cheaper on SDPA's math path).

    Chunk i covers queries [qs, qe) and keys [ks, qe). When all chunks' masks together fit in
    ``max_mask_bytes`` they are built once per forward and shared by the layers; otherwise each layer rebuilds
    them, so at most one chunk's mask is alive at a time.
    """

    FOLD_ROWS = 256
    BIAS_ROWS = 512  # query chunk of a learned distance bias in training (distance_bias.py)
    BAND_MIN = 4  # ... taken from T >= BAND_MIN x its band width on

    def __init__(self, encoding: encodings.Encoding, pos: torch.Tensor, window: Optional[int], max_mask_bytes: int):
        self.encoding = encoding
        self.pos = pos
        self.window = window
        T = pos.shape[0]
        self.folded = encoding.has_bias and encoding.has_low_rank_bias
        explicit_bias = encoding.has_bias and not self.folded
        # a learned distance bias in training: flash kernel + band gradient instead of SDPA's math path, once
        # the sequence is long enough for that to pay (measured: 0.74x the time at 1024 tokens, 1.55x at 128)
        self.distance_bias = None
        if explicit_bias and encoding.has_distance_bias and torch.is_grad_enabled() and distance_bias.supported(pos):
            r = encoding.distance_bias()  # (H, W + 1), carries the gradient
            if T >= self.BAND_MIN * (r.shape[1] - 1):
                self.distance_bias = r
        self.fused = not encoding.has_bias and window is None
        if self.fused:
            self.chunks = [(0, T, 0)]
        else:
            row_bytes = 4 * max(1, encoding.n_heads if explicit_bias else 1) * T
            size = max(1, min(T, max_mask_bytes // row_bytes))
            if self.folded:
                size = min(size, self.FOLD_ROWS)
            elif self.distance_bias is not None:
                size = min(size, self.BIAS_ROWS)  # keys [0, qe) per chunk: skips most of the masked upper half
            self.chunks = []
            for qs in range(0, T, size):
                qe = min(T, qs + size)
                ks = 0 if window is None else max(0, qs - window + 1)
                self.chunks.append((qs, qe, ks))
        # chunks that need no mask: SDPA's own causal mask is exact for a square chunk from position 0
        self.causal = [not explicit_bias and window is None and qs == 0 for qs, _, _ in self.chunks]
        mask_heads = encoding.n_heads if explicit_bias else 1
        mask_bytes = sum(4 * mask_heads * (qe - qs) * (qe - ks) for (qs, qe, ks), c in zip(self.chunks, self.causal) if not c)
        self._keep_masks = mask_bytes <= max_mask_bytes
        self._masks: dict[int, torch.Tensor] = {}
        self._factors: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def mask(self, i: int, dtype: torch.dtype) -> Optional[torch.Tensor]:
        if self.causal[i]:
            return None
        if i in self._masks:
            return self._masks[i].to(dtype)
        qs, qe, ks = self.chunks[i]
        q_pos, k_pos = self.pos[qs:qe], self.pos[ks:qe]
        rel = k_pos[None, :] - q_pos[:, None]  # (q, k): key minus query position
        allowed = rel <= 0
        if self.window is not None:
            allowed = allowed & (rel > -self.window)
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.distance_bias is None):  # else: a constant
            bias = None if self.folded else self.encoding.bias(q_pos, k_pos)  # (1, H, q, k) or None
        if bias is None:
            mask = torch.zeros(1, 1, *allowed.shape, device=self.pos.device)
        else:
            mask = bias.float()
        mask = mask.masked_fill(~allowed, float("-inf"))  # (1, H or 1, q, k)
        if self._keep_masks:
            self._masks[i] = mask
        return mask.to(dtype)

    def _bias_factors(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i not in self._factors:  # float64 factors, shared by all layers of this forward
            qs, qe, ks = self.chunks[i]
            self._factors[i] = self.encoding.bias_factors(self.pos[qs:qe], self.pos[ks:qe])
        return self._factors[i]  # (H, q, E), (H, k, E)

    @staticmethod
    def _fold_parts(dtype: torch.dtype) -> int:
        return 2 if dtype.itemsize >= 4 else 3  # float32: 2 parts; bf16/fp16: 3

    def fold_channels(self, head_dim: int, dtype: torch.dtype) -> int:
        """How many channels ``fold_bias`` appends to q and k (and the model to v) for this head dimension."""
        E2 = self._bias_factors(0)[0].shape[-1] * self._fold_parts(dtype)
        return E2 + (-(head_dim + E2) % 8)

    def fold_bias(self, i: int, q: torch.Tensor, k: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the encoding's bias factors to chunk i's q (B, H, q, D) and k (B, H, k, D), so that
        scale * q' . k' = scale * q . k + bias + a per-query constant; v needs ``fold_channels`` zero channels
        to match (SDPA's fused kernels need one head dimension). Each key factor is split into a high part in
        q's dtype and rounding rests (2 parts in float32, 3 in bf16), so the bias keeps at least float32
        precision; channels are padded to a multiple of 8 for the GPU kernels."""
        qf, kf = self._bias_factors(i)  # (H, q, E), (H, k, E)
        parts, rest = [], kf / scale
        for _ in range(self._fold_parts(k.dtype)):
            parts.append(rest.to(k.dtype))
            rest = rest - parts[-1].double()
        qx = torch.cat([qf] * len(parts), -1).to(q.dtype)  # (H, q, parts * E)
        kx = torch.cat(parts, -1)  # (H, k, parts * E)
        pad = self.fold_channels(q.shape[-1], q.dtype) - qx.shape[-1]
        B = q.shape[0]
        q = torch.cat((q, F.pad(qx, (0, pad)).expand(B, -1, -1, -1)), -1)
        k = torch.cat((k, F.pad(kx, (0, pad)).expand(B, -1, -1, -1)), -1)
        return q, k


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
        # (B, T, C) -> (B, H, T, D)
        q, k, v = (t.view(B, T, self.n_heads, D).transpose(1, 2) for t in (q, k, v))
        q, k = encoding.rotate(q, k, plan.pos)
        if plan.folded:  # zero channels to match the bias channels folded into q and k, once for all chunks
            v = F.pad(v, (0, plan.fold_channels(D, v.dtype)))  # (B, H, T, D + extra)
        outs = []
        for i, (qs, qe, ks) in enumerate(plan.chunks):
            qc, kc, vc = q[:, :, qs:qe], k[:, :, ks:qe], v[:, :, ks:qe]
            if plan.folded:
                qc, kc = plan.fold_bias(i, qc, kc, scale)  # (B, H, *, D + extra channels)
            mask = plan.mask(i, q.dtype)  # None (causal chunk) or (1, H or 1, qe - qs, qe - ks)
            if plan.distance_bias is not None:
                y = distance_bias.distance_bias_attention(qc, kc, vc, plan.distance_bias, mask, scale, qs, ks)
            else:
                y = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=mask, is_causal=mask is None, scale=scale)
            outs.append(y[..., :D])
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
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
                 seed: int = 0, max_mask_bytes: int = 64 << 20) -> None:
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
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 1_000_003)
            self.encoding = build_encoding(cfg, encoding, train_len)

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * self.cfg.n_layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, T) token ids -> logits (B, T, vocab)."""
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)  # (T,)
        x = self.encoding.embed(self.tok_emb(idx), pos)  # (B, T, C)
        plan = AttentionPlan(self.encoding, pos, self.window, self.max_mask_bytes)
        for block in self.blocks:
            x = block(x, self.encoding, plan)
        return self.lm_head(self.ln_f(x))


def build_encoding(cfg: ModelConfig, encoding: str, train_len: int) -> encodings.Encoding:
    """The encoding with its options from cfg.encoding_options (an eval-only variant inherits its base's)."""
    trained_as = encodings.get_class(encoding).trained_as
    options = {**cfg.encoding_options.get(trained_as, {}), **cfg.encoding_options.get(encoding, {})}
    try:
        return encodings.build(encoding, d_model=cfg.d_model, n_heads=cfg.n_heads, train_len=train_len, options=options)
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
