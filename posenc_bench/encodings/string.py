"""STRING, a zero-shot fix of the trained ``rope`` model that shifts well-trained relative positions over the
rarely trained large ones.

- ``rope-string``: ShifTed Rotary position embeddING, An et al., "Why Does the Effective Context Length of LLMs
  Fall Short?" (arXiv:2410.18745; ICLR 2025), code github.com/HKUNLP/STRING at commit 216cc2f
  (``string_for_llama.py``). With shift S and local window W, a pair at relative distance d = i - j keeps
  d while d < S and takes d - S + W from S on: the position matrix's diagonals from the offset S on are
  overwritten by the well-trained positions W, W + 1, ... (the paper's Fig. 5). The code splits each
  attention into the two parts this module's base runs too (``rope_fixes.PairwiseRoPE``): q and k at their
  own positions for the near pairs, q at i - S + W (``forward``, lines 414-415: ``position_ids - diag_size +
  local_window``) with k at j for the far ones, merged by log-sum-exp (``string_flash_forward``, lines
  323-367). Both rotations are scaled by 0.1 ln 2 + 1 (``replace_with_string`` line 739, applied to cos and sin
  in ``RotaryEmbedding._set_cos_sin_cache`` lines 308-309; their vLLM port multiplies q and k by the same
  ``mscale``, ``vllm_string/vllm/model_executor/layers/rotary_embedding.py`` lines 1017 and 1153), so every
  logit grows by (0.1 ln 2 + 1)^2, YaRN's temperature at s = 2: "STRING will make the attention map smooth, we
  use the attention_factor to recover it" (line 738). ``attention_factor`` sets it.

Defaults: S = int(0.33 L) for train length L (README line 28, ``shifted_offset=int(0.33 * L)`` with L the
model's ``max_position_embeddings``; 43253 for Llama 3.1's 131072, README line 55), the same S at every eval
length, as that snippet runs any input. W = 128 tokens (README line 28, ``small_local_value=128``; the
``--local_value`` default of their Llama scripts, ``ruler/test_ruler_llama.py`` line 63, ``niah/test_niah_llama.py``
line 129; their Qwen2 RULER script's is 512, ``ruler/test_ruler_qwen2.py`` line 64) from train length 2048 on;
below it W = L / 16 (128 of 2048), at least 1. Ours: their 128 is an absolute window for the 8k-128k-token
models they run; at our train lengths of 64-512 it would be from a quarter of the window to more than all of it,
and reach past S itself (every shifted position must stay below the exact ones it overwrites, W < S); 2048 is
our longest train length (``long-2048.yaml``), where the authors' value then holds as it is.

Deviations, each for its reason:

- The pair at distance exactly S: their prefill (``string_flash_forward``) runs the near part with flash
  attention's window ``[diag_size, 0]``, which is inclusive (distances 0 .. S), and the far part causally over
  the keys up to i - S (distances S and more), so that one key per query enters the softmax twice, at
  positions S and W. Their decoding path (``forward`` lines 426-434: near keys the last ``diag_size``) and the
  paper's matrix count it once, shifted; so do we (the parts of ``has_attention_parts`` are disjoint).
- The factor 0.1 ln 2 + 1 is applied only at eval lengths where some pair is shifted (longer than S); theirs
  applies at every length once patched. Its stated reason is to undo the smoothing the shift causes, and so
  the row is plain ``rope``, bitwise, wherever it shifts nothing. ``attention_factor: 1`` gives the position
  rule alone (as ``rope_fixes``' rows run theirs).

Tuning (``tuning_grid``; ``bench/eval/tune.py``): the default first, then the position rule alone (factor 1),
then S at the ends of the README's "0.25~0.4 * L" (line 29) and at 0.5 L (``niah/test_niah_llama.py``'s
``--shifted_ratio`` default, line 128), W at 2 and 4 times the default (the README's "128, 256, 512", line 29;
"We suggest increasing 128 to 512", line 197), S = int(0.33 N) of the eval length N (their scripts' rule:
``shifted_offset = int(args.shifted_ratio * test_max_length)``, ``ruler/test_ruler_llama.py`` line 115 and
``niah/test_niah_llama.py`` line 155; they test at lengths up to L, where it is no larger than the default),
and, ours, past the train length, the smallest S that keeps every shifted position below L: S = N - L + W,
where that S is at most L (up to N = 2L - W; beyond, no S keeps both parts within the trained positions).
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from posenc_bench.encodings.registry import register
from posenc_bench.encodings.rope_fixes import PairwiseRoPE

SHIFT_SHARE = Fraction(33, 100)  # S = int(0.33 * L): README line 28 at commit 216cc2f
LOCAL_WINDOW = 128  # W: README line 28, their Llama scripts' --local_value default
LOCAL_WINDOW_DIVISOR = 16  # ours: W = L / 16 below train length 2048, where L / 16 reaches the authors' 128
ATTENTION_FACTOR = 0.1 * math.log(2) + 1  # on cos and sin: string_for_llama.py line 739 at 216cc2f
# The grid's other shifts, as shares of L: the README's "0.25~0.4 * L" (line 29) and niah's 0.5 (line 128).
SHIFT_GRID = (Fraction(1, 4), Fraction(2, 5), Fraction(1, 2))
WINDOW_MULTIPLES = (2, 4)  # the grid's other W: the README's 256 and 512 of its 128 (line 29)


def shift_at(share: Fraction, length: int) -> int:
    """S as a share of a length, int(share * length), at least 2 (room for a window W >= 1 below it)."""
    return max(2, math.floor(share * length))


def default_shift(train_len: int) -> int:
    """The authors' S, int(0.33 L)."""
    return shift_at(SHIFT_SHARE, train_len)


def default_local_window(train_len: int) -> int:
    """The authors' W of 128 tokens, at most L / 16 (ours, for train lengths below 2048), at least 1."""
    return max(1, min(LOCAL_WINDOW, train_len // LOCAL_WINDOW_DIVISOR))


@register("rope-string")
class STRING(PairwiseRoPE):
    summary = "the trained rope model with distances d >= S at position d - S + W (STRING), zero-shot; An et al. 2024"
    paper = "An et al., ICLR 2025, STRING (arXiv:2410.18745)"

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, theta: float = 10000.0, shift: int = 0,
                 local_window: int = 0, attention_factor: float = ATTENTION_FACTOR) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len, theta=theta)
        if shift < 0 or local_window < 0:
            raise ValueError(f"STRING shift and local_window must be 0 (the authors' int(0.33 L) and 128 tokens, "
                             f"at most L / {LOCAL_WINDOW_DIVISOR}) or positive, got shift={shift}, "
                             f"local_window={local_window}")
        self.shift = shift or default_shift(train_len)
        self.local_window = local_window or default_local_window(train_len)
        if self.local_window >= self.shift:
            raise ValueError(f"STRING local_window W must be below shift S (the shifted positions W, W + 1, ... "
                             f"overwrite larger ones), valid 1 .. {self.shift - 1}; got W={self.local_window}, "
                             f"S={self.shift}")
        if not attention_factor > 0:
            raise ValueError(f"STRING attention_factor must be > 0 (the authors' 0.1 ln 2 + 1 = "
                             f"{ATTENTION_FACTOR:.4f}; 1: none), got {attention_factor}")
        self.attention_factor = float(attention_factor)

    @classmethod
    def tuning_grid(cls, train_len: int, eval_len: int, options: dict) -> list[dict]:
        """(S, W, factor) points, the module docstring's "Tuning", the authors' default first; configured options
        take their values in every point; points with W >= S are left out; [] where every point's S is at least
        the eval length (plain rope for all of them)."""
        L, N = train_len, eval_len
        held_s, held_w = options.get("shift") or 0, options.get("local_window") or 0
        S0, W0 = default_shift(L), held_w or default_local_window(L)
        pairs = [(S0, W0)] + [(shift_at(f, L), W0) for f in SHIFT_GRID] + [(S0, m * W0) for m in WINDOW_MULTIPLES]
        pairs.append((default_shift(N), W0))  # their scripts' S: a share of the eval length
        if L < N <= 2 * L - W0:  # ours: every shifted position N - 1 - S + W below L, and S - 1 below L
            pairs.append((N - L + W0, W0))
        pairs = [(held_s or s, held_w or w) for s, w in pairs]
        factor = options.get("attention_factor")
        factors = [float(factor)] if factor else [ATTENTION_FACTOR, 1.0]
        points = [(pairs[0], f) for f in factors] + [(p, factors[0]) for p in pairs[1:]]
        grid = [{"shift": s, "local_window": w, "attention_factor": f}
                for (s, w), f in dict.fromkeys(points) if w < s]
        return grid if any(p["shift"] < N for p in grid) else []

    def set_eval_length(self, length: int) -> None:
        super().set_eval_length(length)
        scale = self.attention_factor if self.has_attention_logits else 1.0
        if scale != self.attention_scale:  # on cos and sin, as the authors do: both rotations of every pair
            self._set_frequencies(self.inv_freq, scale)

    def active_from(self) -> int:
        return self.shift  # a window of S tokens has distances below S only

    def near(self) -> int:
        return self.shift

    def far_positions(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q_pos - self.shift + self.local_window, k_pos  # distance (i - j) - S + W

