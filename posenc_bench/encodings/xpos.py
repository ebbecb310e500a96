"""xPos: rotary embeddings with an exponential decay of the logits with distance.

Sun, Dong, Patra, Ma, Huang, Benhaim, Chaudhary, Song & Wei, "A Length-Extrapolatable Transformer", ACL 2023
(arXiv:2212.10554), sec. 3.2: on top of RoPE's rotation, q at position n is scaled by zeta^(n/B) and k at
position m by zeta^(-m/B), per frequency pair i with zeta_i = (i / (D/2) + gamma) / (1 + gamma), gamma = 0.4,
so the logit of query n and key m carries zeta_i^((n - m)/B): a decay with distance that is strongest on the
highest frequencies. B, the scale base, is 512 as in the paper and torchscale's ``XPOS`` (``scale_base``).
Only n - m matters, so positions are centred on the window's middle before the powers are taken (as
torchscale does) to keep both factors near 1 at long lengths.

- ``xpos``: the encoding, trained from scratch.
- ``xpos+bca``: the trained ``xpos`` model evaluated with the paper's blockwise causal attention (sec. 3.3)
  past the train length: the window is cut into blocks of ``block`` tokens and each query sees its own
  block and the previous one, so no query meets a distance beyond what training showed. The block size
  defaults to half the train length, the paper's: "If the pre-training length is l, we divide the query as
  blocks with l/2 length, and each query interacts with its own block and the last block" (sec. 3.3,
  "Blockwise Causal Attention"; its models train at l = 1024, sec. 4.1, so blocks of 512). Training is plain
  causal attention and the blocks apply to longer inputs only (fig. 2), as here. The authors' released code
  (microsoft/torchscale, ``XPOS`` in torchscale/component/xpos_relative_position.py) has xPos but no
  blockwise attention, so the paper is the only source. Another size is the option ``block``.
"""

from __future__ import annotations

from typing import Optional

import torch

from posenc_bench.encodings.base import consecutive_start
from posenc_bench.encodings.registry import register
from posenc_bench.encodings.rope import RoPE, apply_rotary


def xpos_zeta(head_dim: int, gamma: float = 0.4) -> torch.Tensor:
    """(D/2,) float64 zeta_i = (i / (D/2) + gamma) / (1 + gamma), i = 0 .. D/2 - 1."""
    half = head_dim // 2
    return (torch.arange(half, dtype=torch.float64) / half + gamma) / (1 + gamma)


def xpos_scales(pos: torch.Tensor, zeta: torch.Tensor, scale_base: float) -> torch.Tensor:
    """zeta^((n - c) / B) for positions n (T,) or (B, T), c the middle position of each row: (T, D/2) or
    (B, 1, T, D/2), float64."""
    c = (pos[..., :1] + pos[..., -1:]) // 2  # (1,) or (B, 1)
    power = (pos - c).to(torch.float64) / scale_base  # (T,) or (B, T)
    scales = zeta.to(pos.device)[None, :] ** power[..., None]  # (T, D/2) or (B, T, D/2)
    return scales if pos.dim() == 1 else scales[:, None]


@register("xpos")
class XPos(RoPE):
    summary = "RoPE with per-frequency exponential decay of q.k with distance (xPos); Sun et al. 2023"
    family = "rotary"
    newer = True
    paper = "Sun et al., ACL 2023 (arXiv:2212.10554)"

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, theta: float = 10000.0,
                 scale_base: float = 512.0, gamma: float = 0.4) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len, theta=theta)
        if scale_base <= 0 or gamma <= 0:
            raise ValueError(f"xPos needs scale_base > 0 and gamma > 0, got {scale_base}, {gamma}")
        self.scale_base = float(scale_base)
        self.zeta = xpos_zeta(self.head_dim, gamma)
        self._xcache: Optional[tuple] = None

    def rotate(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cached = self._xcache
        key = pos if pos.dim() == 2 else (pos.shape[0], consecutive_start(pos), pos.device)  # start None: not cached
        if cached is None or not (cached[0] is key if pos.dim() == 2 else cached[0] == key) or cached[1].dtype != q.dtype:
            cos, sin = self.cos_sin(pos, torch.float64)  # (T, D/2) or (B, 1, T, D/2)
            s = xpos_scales(pos, self.zeta, self.scale_base)
            # the rotation is linear, so scaling cos and sin scales the rotated pair: q by s, k by 1/s
            cached = (key, *((t.to(q.dtype)) for t in (cos * s, sin * s, cos / s, sin / s)))
            if key is pos or key[1] is not None:
                self._xcache = cached
        _, qc, qs, kc, ks = cached
        return apply_rotary(q, qc, qs), apply_rotary(k, kc, ks)


@register("xpos+bca")
class XPosBCA(XPos):
    summary = "the trained xpos model with blockwise causal attention past the train length (xPos+BCA); Sun et al. 2023"
    trained_as = "xpos"

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, theta: float = 10000.0,
                 scale_base: float = 512.0, gamma: float = 0.4, block: int = 0) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len, theta=theta,
                         scale_base=scale_base, gamma=gamma)
        if block < 0:
            raise ValueError(f"block must be >= 0 (0: half the train length, the paper's l/2), got {block}")
        self.block = block or max(1, train_len // 2)  # sec. 3.3: blocks of l/2 for pre-training length l

    def attention_block(self, length: int) -> Optional[int]:
        """Blocks only past the train length: up to it, the model attends as it was trained."""
        return self.block if length > self.train_len else None
