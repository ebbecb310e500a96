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
  the authors' code merges the two attentions. The defaults of W (``neighbor_window``) and G (``group``) at
  each eval length N come from the authors' rules (``selfextend_defaults``; the README of
  github.com/datamllab/LongLM at commit cdbbb06, "How to choose the group_size and neighbor_window", lines
  90-116): every window must fit, (L - W) G + W >= N (line 96), and the farthest grouped position must stay
  among the well-trained ones, W + (N - W) / G < s L with s their "1/2 ~ 2/3" (line 110), here 2/3.

Each is applied only where it changes something: ReRoPE from windows longer than w on (below, every pair is
within w), Self-Extend from windows longer than the train length on (the distances below it were trained);
elsewhere the row is plain ``rope``, on its fused path, bitwise. The authors' code also scales queries by
log(i + 1) / log(L) past the train length (log-n attention scaling, a separate technique the ``rope`` model
was not trained with); these rows leave it out, so they measure the position rule alone.

Each declares the grid ``eval.tune`` chooses its options from on the valid split (``tuning_grid``,
``bench/eval/tune.py``), its authors' values first.
"""

from __future__ import annotations

import math
from fractions import Fraction
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


# ReRoPE's tuning grid, w as fractions of the train length: the author's code's eighth (above), his README's
# quarter (its loss table's ReRoPE-w1024 of Llama 2's 4096, github.com/bojone/rerope README at acfe788), and
# ours beyond them toward the train length: a half (this row's former default) and three quarters.
WINDOW_GRID = (Fraction(1, 8), Fraction(1, 4), Fraction(1, 2), Fraction(3, 4))
LEAKY_SLOPE = 16.0  # Leaky ReRoPE's k: the author's scaling_factor (leaky_rerope_patch.py line 139 at acfe788)

# Self-Extend's (G, W) by the authors' rules: the README of github.com/datamllab/LongLM at commit cdbbb06,
# section "3. How to choose the group_size and neighbor_window" (lines 90-116).
SELFEXTEND_SHARE = Fraction(2, 3)  # s of "(1/2 ~ 2/3) x L > W + (N - W) / G" (line 110): the upper end
NEIGHBOR_RANGE = (Fraction(1, 8), Fraction(3, 8))  # W of "512~1536 are feasible" at Llama 2's 4096 (line 94)
GROUP_RANGE = (2, 64)  # G of "2~64 are reasonable for group_size" (line 94)


def selfextend_fits(train_len: int, length: int, group: int, window: int,
                    share: Fraction = SELFEXTEND_SHARE) -> bool:
    """Both of the authors' inequalities for (G, W) at eval length N (L the train length): every position fits,
    (L - W) G + W >= N (README line 96), and the farthest grouped one is well trained, W + (N - W) / G < s L
    (line 110: "only a portion (1/2 ~ 2/3) of positions are well trained")."""
    L, N, G, W = train_len, length, group, window
    return (L - W) * G + W >= N and W + Fraction(N - W, G) < share * L


def fitting_group(train_len: int, length: int, window: int) -> int:
    """The smallest G with (L - W) G + W >= N: every position of the length fits (the rule this row had alone
    before; the README's "calculated by: G * (L - w_n) + w_n", line 101)."""
    L, N, W = train_len, length, window
    return max(1, -(-(N - W) // (L - W))) if L > W else max(1, N)


def smallest_group(train_len: int, length: int, window: int, share: Fraction = SELFEXTEND_SHARE) -> int:
    """The smallest G >= 2 that meets both inequalities with neighbour window W (the README's "try the smallest
    group size first", line 101); where none can (W >= s L leaves the grouped keys no well-trained position),
    ``fitting_group``."""
    L, N, W = train_len, length, window
    if share * L <= W:
        return fitting_group(L, N, W)
    return max(GROUP_RANGE[0], fitting_group(L, N, W), math.floor(Fraction(N - W) / (share * L - W)) + 1)


def neighbor_range(train_len: int) -> tuple[int, int]:
    """The authors' neighbour windows scaled to train length L: 512 .. 1536 of 4096 is L / 8 .. 3 L / 8, within
    1 .. L - 1."""
    low = max(1, math.ceil(NEIGHBOR_RANGE[0] * train_len))
    return low, max(low, min(train_len - 1, math.floor(NEIGHBOR_RANGE[1] * train_len)))


def selfextend_defaults(train_len: int, length: int, group: int = 0, neighbor_window: int = 0) -> tuple[int, int]:
    """Self-Extend's (G, W) at eval length N (train length L), each the configured one or the authors' rules:

    among the pairs that meet both of the authors' inequalities (``selfextend_fits``) with W in their range
    (``neighbor_range``) and G in theirs (2 .. 64), the widest neighbour window W, and with it the smallest
    group G. The widest W: the README has larger windows give "more neighbor information" and lets the
    inequality bound them ("Excessively large neighbor window sizes can also degrade performance", line 112);
    the smallest G: "For the same sequence, smaller group should be better" (line 98), "try the smallest group
    size first" (line 101). s = 2/3, the upper end of the authors' range, allows the smallest groups; their
    own settings sit between 0.49 L (example.py lines 15-16, ``window_size = 1024``, ``group_size = 32``, with
    the README's 32k-token passkey example, line 21) and 0.70 L (G 8 for 15,800 tokens, line 99). Where no pair
    is in range (N past about 35 L), W is the range's smallest and G the smallest that meets both. With W
    configured, G is ``smallest_group``; with G configured, W is the widest up to 3 L / 8 that meets both (else
    the widest that does, else the range's smallest). At N <= L the row is plain rope whatever the pair (the
    pair of N = L is returned).
    """
    L, N = train_len, max(length, train_len)
    low, high = neighbor_range(L)
    if neighbor_window:
        return group or smallest_group(L, N, neighbor_window), neighbor_window
    if group:
        fitting = [W for W in range(L - 1, 0, -1) if selfextend_fits(L, N, group, W)]
        return group, next((W for W in fitting if W <= high), fitting[0] if fitting else low)  # widest first
    for W in range(high, low - 1, -1):
        G = smallest_group(L, N, W)
        if G <= GROUP_RANGE[1] and selfextend_fits(L, N, G, W):
            return G, W
    return smallest_group(L, N, low), low


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

    @classmethod
    def tuning_grid(cls, train_len: int, eval_len: int, options: dict) -> list[dict]:
        """w (``window``) at each of ``WINDOW_GRID``'s fractions of the train length, the author's eighth first (a
        configured w: that one); at every eval length, 1x too (the row clips distances from w on)."""
        windows = [options["window"]] if options.get("window") else [math.floor(f * train_len) for f in WINDOW_GRID]
        return [{"window": w} for w in dict.fromkeys(max(1, w) for w in windows)]

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
                 slope: float = LEAKY_SLOPE) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len, theta=theta, window=window)
        if slope <= 1:
            raise ValueError(f"Leaky ReRoPE needs slope k > 1 (positions beyond w grow by 1/k), got {slope}")
        self.slope = float(slope)

    @classmethod
    def tuning_grid(cls, train_len: int, eval_len: int, options: dict) -> list[dict]:
        """ReRoPE's windows, each with the author's k = 16 first and then the smallest k (in tenths) that keeps
        the eval length's farthest distance among the trained ones, w + (N - 1 - w) / k <= L - 1 (ours: Leaky
        ReRoPE's counterpart of Self-Extend's (L - W) G + W >= N), where that k is above 1 (a configured k: that
        one)."""
        points = []
        for point in super().tuning_grid(train_len, eval_len, options):
            w, slopes = point["window"], [float(options.get("slope") or LEAKY_SLOPE)]
            if train_len - 1 > w and not options.get("slope"):
                slopes.append(math.ceil(Fraction(10 * (eval_len - 1 - w), train_len - 1 - w)) / 10)
            points += [{"window": w, "slope": k} for k in dict.fromkeys(slopes) if k > 1]
        return points

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
            raise ValueError(f"Self-Extend neighbor_window must be 0 (the authors' rule at each eval length) or "
                             f"1 .. {train_len - 1}, got {neighbor_window}")
        if group < 0:
            raise ValueError(f"Self-Extend group must be 0 (the authors' rule at each eval length) or >= 1, "
                             f"got {group}")
        self.fixed_window, self.fixed_group = neighbor_window, group
        self.group, self.neighbor_window = self.pair_for(train_len)

    @classmethod
    def eval_options(cls, options: dict) -> dict:
        """The default pair's rule, part of the eval key and the records where it decides a value: numbers made
        with the former defaults (W = L / 4, G the smallest that fits) are not reused."""
        if options.get("neighbor_window") and options.get("group"):
            return {}
        return {"default_pair": f"LongLM README rules: W in L/8..3L/8 widest, then G in 2..64 smallest, "
                                f"(L - W) G + W >= N and W + (N - W) / G < {SELFEXTEND_SHARE} L"}

    @classmethod
    def tuning_grid(cls, train_len: int, eval_len: int, options: dict) -> list[dict]:
        """(G, W) at eval length N > L (at N <= L the row is plain rope: nothing to tune): the authors' pair
        (``selfextend_defaults``) first, then its W with twice its G (the README's "then test whether larger
        group can be better", line 101), then for W of L/8, L/4, 3L/8 (the authors' range and their example's
        1024 of 4096) and L/2 (ours, beyond it: "most common is setting grp-attn-w to be half of the original
        training context", a comment on github.com/ggml-org/llama.cpp pull 4815) the smallest G that meets
        both inequalities and the smallest that fits the length alone (the row's former rule). A configured W
        keeps only its own pairs; a configured G, only pairs with it."""
        L, N, held_g, held_w = train_len, eval_len, options.get("group") or 0, options.get("neighbor_window") or 0
        if N <= L:
            return []
        G, W = selfextend_defaults(L, N, held_g, held_w)
        pairs = [(G, W)] + ([] if held_g else [(2 * G, W)])
        shares = (Fraction(1, 8), Fraction(1, 4), Fraction(3, 8), Fraction(1, 2))
        for w in [held_w] if held_w else [min(L - 1, max(1, math.floor(s * L))) for s in shares]:
            pairs += [(held_g, w)] if held_g else [(smallest_group(L, N, w), w), (fitting_group(L, N, w), w)]
        return [{"group": g, "neighbor_window": w} for g, w in dict.fromkeys(pairs)]

    def pair_for(self, length: int) -> tuple[int, int]:
        """(G, W) at this eval length: the configured ones, or the authors' rules (``selfextend_defaults``)."""
        return selfextend_defaults(self.train_len, length, self.fixed_group, self.fixed_window)

    def set_eval_length(self, length: int) -> None:
        super().set_eval_length(length)
        self.group, self.neighbor_window = self.pair_for(length)

    def active_from(self) -> int:
        return self.train_len

    def near(self) -> int:
        return self.neighbor_window

    def far_positions(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        G, W = self.group, self.neighbor_window
        return q_pos // G + W - W // G, k_pos // G
