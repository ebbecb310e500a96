"""Zero-shot fixes of the trained ``rope`` model that change the relative position of each query-key pair.

These are not frequency functions (``rope_scaling.py``): the distance a pair is rotated by depends on the
pair, so each query chunk's logits are built from two rotations of q and k and merged by distance, through
the ``attention_logits`` hook (the model runs it chunk by chunk, memory bounded by the chunk size).

- ``rope-rerope``: ReRoPE, Su, "Rectified Rotary Position Embeddings" (2023; kexue.fm/archives/9708,
  github.com/bojone/rerope). Relative positions from the window w on are clipped to w: pairs with
  i - j < w get (q R_i) . (k R_j), the others (q R_w) . k, so no distance beyond w is ever seen. w (the
  ``window`` option, in tokens) defaults to the author's ratio, an eighth of the train length: his
  ``rerope_patch.py`` sets ``training_length = 4096`` and ``window = 512`` (lines 129-130 at commit acfe788),
  for Llama 2. (The README's loss table reports w = 1024, a quarter; the code's default is the eighth.) The
  default here was formerly half the train length; ``window`` = train length / 2 gives it back.
- ``rope-leaky``: Leaky ReRoPE (same post): beyond w the position grows with slope 1/k instead of staying at
  w: relative position w + (i - j - w) / k, from q rotated at i / k + w (1 - 1/k) and k at j / k, as the
  author's ``leaky_rerope_patch.py`` does; w defaults as ReRoPE's (that file's ``window = 512`` of
  ``training_length = 4096``, lines 138-140) and k (``slope``) to the author's 16 (``scaling_factor``, line
  139).
- ``rope-selfextend``: Self-Extend, Jin et al., "LLM Maybe LongLM: Self-Extend LLM Context Window Without
  Tuning", ICML 2024 (arXiv:2401.01325): neighbours with i - j < W keep their exact relative position,
  farther keys take the grouped one, q at floor(i / G) + W - floor(W / G) and k at floor(j / G), merged as
  the authors' code merges the two attentions. W (``neighbor_window``) defaults to a quarter of the train
  length (the authors' 1024 of 4096); G (``group``) defaults to the smallest group that covers the eval
  length by the authors' rule, G (L - W) + W >= length (L the train length), or a fixed number.

Each is applied only where it changes something: ReRoPE from windows longer than w on (below, every pair is
within w), Self-Extend from windows longer than the train length on (the distances below it were trained);
elsewhere the row is plain ``rope``, on its fused path, bitwise. The authors' code also scales queries by
log(i + 1) / log(L) past the train length (log-n attention scaling, a separate technique the ``rope`` model
was not trained with); these rows leave it out, so they measure the position rule alone.
"""

from __future__ import annotations

import math
from typing import ClassVar, Optional

import torch

from posenc_bench.encodings.registry import register
from posenc_bench.encodings.rope import RoPE, apply_rotary


# ReRoPE's default window w = train length / WINDOW_DIVISOR: the author's 512 of 4096 (rerope_patch.py lines
# 129-130, leaky_rerope_patch.py lines 138-140, github.com/bojone/rerope at commit acfe788).
WINDOW_DIVISOR = 8


def default_window(train_len: int) -> int:
    """ReRoPE's and Leaky ReRoPE's default w: the author's ratio of the train length, at least 1."""
    return max(1, train_len // WINDOW_DIVISOR)


class PairwiseRoPE(RoPE):
    """The trained rope model with a per-pair relative position: exact below ``near`` tokens of distance,
    ``far_positions``' rotations beyond, active for windows longer than ``active_from``."""

    trained_as: ClassVar[Optional[str]] = "rope"
    family = "rotary fix (zero-shot)"
    has_attention_parts = True

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, theta: float = 10000.0) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len, theta=theta)
        self.has_attention_logits = False  # per instance: set_eval_length turns the explicit path on

    def active_from(self) -> int:
        """The longest window on which the row is plain rope."""
        raise NotImplementedError

    def near(self) -> int:
        """Pairs with i - j below this keep their exact relative position."""
        raise NotImplementedError

    def far_positions(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions (q,), (k,) to rotate q and k by for the pairs at distance >= near()."""
        raise NotImplementedError

    def set_eval_length(self, length: int) -> None:
        self.has_attention_logits = length > self.active_from()

    def rotate(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.has_attention_logits:  # rotated per pair in attention_logits
            return q, k
        return super().rotate(q, k, pos)

    def rotated(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x (B, H, T, D) rotated by the angles of positions pos (T,), integer or not."""
        return apply_rotary(x, *self.cos_sin(pos, x.dtype))  # cos, sin (T, D/2)

    def attention_logits(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                         mask: torch.Tensor, scale: float) -> torch.Tensor:
        near = self.rotated(q, q_pos) @ self.rotated(k, k_pos).transpose(-1, -2)  # (B, H, q, k)
        far_q, far_k = self.far_positions(q_pos, k_pos)
        far = self.rotated(q, far_q) @ self.rotated(k, far_k).transpose(-1, -2)  # (B, H, q, k)
        is_near = (q_pos[:, None] - k_pos[None, :]) < self.near()  # (q, k)
        return torch.where(is_near, near, far).float() * scale + mask

    def attention_parts(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
                        ) -> list[tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]]:
        """The near pairs (i - j < near(), exact rotations) and the far ones (``far_positions``), each over the
        keys some query of the chunk has in it (k_pos ascending): the band and the keys before it."""
        near = self.near()
        first_near = int(torch.searchsorted(k_pos, q_pos.min() - near, right=True))  # keys j > min(i) - near
        far_keys = int(torch.searchsorted(k_pos, q_pos.max() - near, right=True))  # keys j <= max(i) - near
        dist = q_pos[:, None] - k_pos[None, :]  # (q, k)
        parts = [(self.rotated(q, q_pos), self.rotated(k[..., first_near:, :], k_pos[first_near:]), first_near,
                  dist[:, first_near:] < near)]
        if far_keys:
            far_q, far_k = self.far_positions(q_pos, k_pos[:far_keys])
            parts.append((self.rotated(q, far_q), self.rotated(k[..., :far_keys, :], far_k), 0,
                          dist[:, :far_keys] >= near))
        return parts


@register("rope-rerope")
class ReRoPE(PairwiseRoPE):
    summary = "the trained rope model with relative positions clipped at w (ReRoPE), zero-shot; Su 2023"
    paper = "Su 2023, ReRoPE (kexue.fm/archives/9708, github.com/bojone/rerope)"

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, theta: float = 10000.0, window: int = 0) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len, theta=theta)
        if window < 0 or window > train_len:
            raise ValueError(f"ReRoPE window must be 0 (train length / {WINDOW_DIVISOR}, the author's ratio) or "
                             f"1 .. the train length {train_len}, got {window}")
        self.window = window or default_window(train_len)

    @classmethod
    def eval_options(cls, options: dict) -> dict:
        """The default window's rule, part of the eval key and the records (an explicit window already is, as
        the row's own option): numbers made with the former default, half the train length, are not reused."""
        return {} if options.get("window") else {"default_window": f"train length / {WINDOW_DIVISOR}"}

    def active_from(self) -> int:
        return self.window

    def near(self) -> int:
        return self.window

    def far_positions(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full_like(q_pos, self.window), torch.zeros_like(k_pos)  # (q R_w) . k: distance w


@register("rope-leaky")
class LeakyReRoPE(ReRoPE):
    summary = "the trained rope model with relative positions growing by 1/k beyond w (Leaky ReRoPE), zero-shot; Su 2023"

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, theta: float = 10000.0, window: int = 0,
                 slope: float = 16.0) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len, theta=theta, window=window)
        if slope <= 1:
            raise ValueError(f"Leaky ReRoPE needs slope k > 1 (positions beyond w grow by 1/k), got {slope}")
        self.slope = float(slope)

    def far_positions(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.slope  # q at i / k + w (1 - 1/k), key at j / k: distance w + (i - j - w) / k
        return q_pos.double() / k + self.window * (1 - 1 / k), k_pos.double() / k


@register("rope-selfextend")
class SelfExtend(PairwiseRoPE):
    summary = "the trained rope model with exact neighbours and floor(pos / G) grouped positions beyond (Self-Extend), zero-shot; Jin et al. 2024"
    paper = "Jin et al., ICML 2024, Self-Extend (arXiv:2401.01325)"

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, theta: float = 10000.0,
                 neighbor_window: int = 0, group: int = 0) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len, theta=theta)
        if neighbor_window < 0 or neighbor_window >= train_len:
            raise ValueError(f"Self-Extend neighbor_window must be 0 (train length / 4) or 1 .. {train_len - 1}, "
                             f"got {neighbor_window}")
        if group < 0:
            raise ValueError(f"Self-Extend group must be 0 (the smallest that covers the eval length) or >= 1, got {group}")
        self.neighbor_window = neighbor_window or max(1, train_len // 4)
        self.fixed_group = group
        self.group = group or 1

    def group_for(self, length: int) -> int:
        """The configured group, or the authors' rule: the smallest G with G (L - W) + W >= length."""
        if self.fixed_group:
            return self.fixed_group
        W = self.neighbor_window
        return max(1, math.ceil((length - W) / (self.train_len - W)))

    def set_eval_length(self, length: int) -> None:
        super().set_eval_length(length)
        self.group = self.group_for(length)

    def active_from(self) -> int:
        return self.train_len

    def near(self) -> int:
        return self.neighbor_window

    def far_positions(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        G, W = self.group, self.neighbor_window
        return q_pos // G + W - W // G, k_pos // G
