"""RoPE/NoPE hybrids: RoPE with a sliding window in most layers, NoPE with full attention in every k-th layer.

``rnope-swa``: RNoPE-SWA (Yang et al. 2025, "Rope to Nope and Back Again: A New Hybrid Attention Strategy",
arXiv:2501.18795), the layout Cohere ships in Command R7B and Command A. Our reference is its code in
transformers (5.25.0), ``models/cohere2``:

- ``configuration_cohere2.py``: ``layer_types[i] = "sliding_attention" if (i + 1) % sliding_window_pattern
  else "full_attention"`` with ``sliding_window_pattern = 4``: layers 3, 7, ... attend to every key, the others
  to a sliding window; ``sliding_window = 4096`` with ``max_position_embeddings = 8192``.
- ``modeling_cohere2.py``, ``Cohere2Attention.forward``: ``apply_rotary_pos_emb`` only ``if self.sliding_window
  is not None``: the sliding layers are RoPE, the full ones NoPE.

So ``period`` (4) and ``window`` (0: half the train length, Cohere2's 4096 of 8192) are the options; a
NoPE layer attends with the model's own window (none unless the row names one, ``rnope-swa+sw64``). A model
with fewer layers than ``period`` gets one NoPE layer, its last (our choice: Cohere2 would have none).

``attn_scale`` > 0 adds Llama 4's attention temperature to the NoPE layers (transformers
``models/llama4/modeling_llama4.py``, ``Llama4TextAttention.forward``: with ``attn_temperature_tuning`` the
queries of a NoPE layer are scaled by ``log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1``; Llama 4's
defaults ``attn_scale = 0.1``, ``floor_scale = 8192``, its local attention's chunk). Here ``floor_scale`` 0
means the train length, so the scale is 1 within it and grows past it as Llama 4's does past 8192 tokens; Llama
4's RoPE layers use chunked (block-local) attention and QK-norm, which this row does not take: it is the
Cohere2 layout with that temperature as an option, off by default (``attn_scale = 0``).
"""

from __future__ import annotations

from typing import Any

import torch

from posenc_bench.encodings.base import Encoding, LayerOf
from posenc_bench.encodings.registry import register
from posenc_bench.encodings.rope import RoPE


@register("rnope-swa")
class RNoPESWA(Encoding):
    """RoPE with a sliding window of ``window`` keys in every layer but each ``period``-th, which is NoPE with
    full attention (``for_layer`` gives each layer's view; as itself the encoding is layer 0, a RoPE layer)."""

    summary = "RoPE + sliding window in 3 of 4 layers, NoPE full attention in the 4th; Yang et al. 2025"
    family = "rotary"
    paper = "Yang et al. 2025, RNoPE-SWA (arXiv:2501.18795)"
    newer = True

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, n_layers: int = 1, period: int = 4,
                 window: int = 0, attn_scale: float = 0.0, floor_scale: int = 0) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len)
        if period < 1 or window < 0 or floor_scale < 0 or attn_scale < 0:
            raise ValueError(f"rnope-swa needs period >= 1, window >= 0, floor_scale >= 0 and attn_scale >= 0, got "
                             f"period={period}, window={window}, floor_scale={floor_scale}, attn_scale={attn_scale}")
        self.n_layers, self.period = n_layers, period
        self.window = window or max(1, train_len // 2)
        self.attn_scale, self.floor_scale = attn_scale, floor_scale or train_len
        self.rope = RoPE(d_model=d_model, n_heads=n_heads, train_len=train_len)

    @property
    def own_window(self) -> int:  # type: ignore[override]
        """The RoPE layers' sliding window (the NoPE layers' view says None: the model's own)."""
        return self.window

    @staticmethod
    def nope_layers(n_layers: int, period: int) -> list[int]:
        """The NoPE, full-attention layers: i with (i + 1) % period == 0 (Cohere2's ``layer_types``); in a model
        of fewer layers than ``period`` (the task track's 2), the last layer, so that every model is a hybrid
        (Cohere2 would make them all sliding RoPE layers)."""
        return [i for i in range(n_layers) if (i + 1) % period == 0] or [n_layers - 1]

    def for_layer(self, layer: int) -> Any:
        return NoPELayer(self, layer) if layer in self.nope_layers(self.n_layers, self.period) else self

    def rotate(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rope.rotate(q, k, pos)

    def temperature(self, pos: torch.Tensor) -> torch.Tensor:
        """Llama 4's query scale (T,) at positions pos (T,): log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1."""
        steps = torch.floor((pos.to(torch.float32) + 1.0) / self.floor_scale)
        return torch.log1p(steps) * self.attn_scale + 1.0


class NoPELayer(LayerOf):
    """A NoPE layer of ``rnope-swa``: no rotation, full attention (the model's own window), queries scaled by
    Llama 4's temperature where ``attn_scale`` > 0."""

    own_window = None

    def rotate(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.encoding.attn_scale:
            return q, k
        scale = self.encoding.temperature(pos).to(q.dtype)  # (T,)
        return q * scale[:, None], k  # (B, H, T, D) * (T, 1)

