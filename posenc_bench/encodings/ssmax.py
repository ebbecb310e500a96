"""Scalable-Softmax: ``<encoding>+ssmax``, a trained encoding whose attention takes SSMax instead of softmax.

Nakanishi, "Scalable-Softmax Is Superior for Attention", arXiv:2501.19399 (2025), v1. Softmax spreads its mass
over more keys as their number n grows, so its largest weight tends to 0 (the paper's "attention fading",
its Fig. 1). SSMax (Eq. 2) replaces softmax(z) over a vector of n values by

    SSMax(z)_i = n^(s z_i) / sum_j n^(s z_j) = exp((s log n) z_i) / sum_j exp((s log n) z_j),

s a learnable scalar ("scaling parameter"). In attention (Eq. 11) query i's weights over the n keys it
attends to are softmax((s log n) q_i K^T / sqrt(d)): the query is multiplied by s log n and the softmax is
left as it is, so every attention kernel runs unchanged. The paper's full text could not be read where this
was written: its abstract and Fig. 1 were, and Eq. 2, Eq. 11, s per layer and head and the bias variant are
taken as implementations and notes quote them (equal in every one read). No code from the author was found
(code and issue indexes searched by title, author and name). What is taken here, and from where:

- **n is the number of keys the query sees**: under causal attention query i (counted from 0) sees n = i + 1;
  under a sliding window of W keys, n = min(i + 1, W). The model tells the encoding its window
  (``set_window``, called once the model is built); positions count from 0 at the first token of every
  window (``base.py``), so query i's position is i.
- **s is one scalar per layer and per head**: ``s`` holds n_layers x n_heads of them, layer by layer, and
  ``for_layer(i)`` is layer i's view, as CoPE's tables are. A vector, not a (n_layers, n_heads) matrix: the
  trainer decays matrices only (``bench/train/loop.py``), and these are scalars, like the norms' gains.
- **s starts at 1** (``s_init``), as the two public implementations read here start it: soda-inria's TabICL
  (``src/tabicl/_model/ssmax.py``, class ``SSMax``: ``nn.Parameter(torch.ones(num_heads))``, q * s * log n;
  read at the copy seekMTL/tabicl, commit 5b5c697) and allenai/OLMo-core pull request 808 (one scalar per query
  head initialised to ones, n = position + 1 under causal attention). The value 0.168 that other
  implementations quote from the paper is 1 / mean_{n = 1..1024} log n (= 0.1685): the s that keeps, on
  average over a 1024-token window, the temperature of a model pretrained with softmax, the start for swapping
  SSMax into such a model; ``s_init`` takes it (or any value) for a row trained from scratch here.
- **no bias by default**: the variant scaling by (s log n + b), b learnable, is reported to lower the training
  loss but to generalise worse past the training length; ``scale_bias: true`` adds it (b per layer and head,
  starting at 0).

Where it applies (``refusal``): a trained encoding whose logits are plain q . k, so that scaling the rotated
query (after the base's own ``rotate``) scales exactly the logit of every pair: NoPE, RoPE, p-RoPE, xPos (its
q and k are rescaled, the logit is still their product) and the absolute encodings, whose positions enter the
hidden states. Not a bias encoding (T5, ALiBi, KERPLE, FIRE: the bias would be scaled too, or not, and no
source read says which), nor one that computes its own logits (CoPE, DAPE, FoX, stick-breaking) or that the
randomized positions reindex. Attention-sink rows over an SSMax row are refused: their queries are rotated
from two positions (the cache's towards the sinks), which would give one query two values of n.
The rows are in the base's family (tables compare rope+ssmax with rope), drawn with the newer encodings. The
paper's claims (long-context loss, key retrieval, length generalisation) are for language models trained with
SSMax from the start (replacing softmax during or after pretraining recovers part of it, its abstract says).
"""

from __future__ import annotations

import inspect
import math
from typing import ClassVar, Optional

import torch
from torch import nn

from posenc_bench.encodings.base import Encoding, LayerOf
from posenc_bench.encodings.registry import REGISTRY, load_modules, register

S_INIT = 1.0  # TabICL's and OLMo-core's start for s (torch.ones)
# The trained encodings that get a ``+ssmax`` row: every one with plain q . k logits that the paper's claim
# (a drop-in replacement of softmax in attention) and its use with RoPE and NoPE models cover.
BASES = ("sinusoidal", "learned", "rope", "rope-partial", "xpos", "nope")


def refusal(base: type[Encoding]) -> Optional[str]:
    """Why SSMax cannot wrap the encoding class ``base`` (its logits are not plain q . k of the queries its
    ``rotate`` returns, or it is no trained encoding), or None when it can."""
    if base.trained_as is not None:
        return f"it evaluates the trained {base.trained_as!r} model (SSMax changes the weights a model learns)"
    if base.has_bias or base.has_low_rank_bias or base.has_distance_bias:
        return "its logits carry an additive bias, which the paper's scale would or would not multiply"
    if base.has_attention_logits or base.has_attention_parts or base.has_attention_output:
        return "it computes its own logits (or weights), not q . k"
    if base.reads_tokens or base.attention_sinks is not None:
        return "its attention reads the tokens or a cache of sinks"
    if base.own_positions or base.positions is not Encoding.positions or base.for_layer is not Encoding.for_layer:
        return "it has positions of its own (or per layer), not the token index i that n = i + 1 counts"
    if base.attention_block is not Encoding.attention_block:
        return "its attention is blockwise, so the keys a query sees are not min(i + 1, W)"
    return None


class ScalableSoftmax(Encoding):
    """The wrapper: ``base`` holds the wrapped encoding, whose hooks it runs; queries leave ``rotate`` scaled by
    s log n (plus b with ``scale_bias``), s of layer 0 (the model asks each layer's view, ``for_layer``)."""

    base_cls: ClassVar[type[Encoding]]
    newer = True
    no_sinks = ("SSMax scales a query by log n, n the keys it sees, and a sink row rotates it from two positions "
                "(its cache position towards the sinks)")

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, n_layers: int = 1, s_init: float = S_INIT,
                 scale_bias: bool = False, **options) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len)
        if n_layers < 1:
            raise ValueError(f"{self.name} needs n_layers >= 1 (one s per attention layer and head), got {n_layers}")
        if isinstance(s_init, bool) or not isinstance(s_init, (int, float)) or not math.isfinite(s_init):
            raise ValueError(f"{self.name}: s_init must be a finite number (1: TabICL's and OLMo-core's start; "
                             f"0.168: the paper's for a softmax-trained model), got {s_init!r}")
        if not isinstance(scale_bias, bool):
            raise ValueError(f"{self.name}: scale_bias must be true or false, got {scale_bias!r}")
        if "n_layers" in inspect.signature(self.base_cls.__init__).parameters:
            options["n_layers"] = n_layers
        self.base = self.base_cls(d_model=d_model, n_heads=n_heads, train_len=train_len, **options)
        self.n_layers = n_layers
        # after the base: its parameters are drawn as the plain encoding's (torch.full draws nothing);
        # (n_layers * n_heads,): layer l's heads are [l * H, (l + 1) * H)
        self.s = nn.Parameter(torch.full((n_layers * n_heads,), float(s_init)))
        self.b = nn.Parameter(torch.zeros(n_layers * n_heads)) if scale_bias else None
        self.window: Optional[int] = None

    @classmethod
    def key_options(cls, train_len: int, options: dict) -> dict:
        """The base's, and s's start and the bias: both change the trained weights."""
        return {**cls.base_cls.key_options(train_len, options), "s_init": float(options.get("s_init", S_INIT)),
                "scale_bias": bool(options.get("scale_bias", False))}

    def set_window(self, window: Optional[int]) -> None:
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"{self.name}: the sliding window must be a whole number >= 1 or None, got {window!r}")
        self.window = window

    def visible_keys(self, pos: torch.Tensor) -> torch.Tensor:
        """n (T,) or (B, T), int64: the keys the query at each position sees, min(i + 1, W)."""
        n = pos + 1
        return n if self.window is None else n.clamp(max=self.window)

    def query_scale(self, layer: int, pos: torch.Tensor) -> torch.Tensor:
        """s log n (+ b) of layer ``layer``: (1, H, T, 1) for (T,) positions, (B, H, T, 1) for (B, T) ones."""
        heads = slice(layer * self.n_heads, (layer + 1) * self.n_heads)
        s = self.s[heads]  # (H,)
        log_n = self.visible_keys(pos).to(s.dtype).log()  # (T,) or (B, T)
        scale = s[:, None] * log_n[..., None, :]  # (H, T) or (B, H, T)
        if self.b is not None:
            scale = scale + self.b[heads][:, None]
        return scale.unsqueeze(-1) if scale.dim() == 3 else scale[None, :, :, None]

    def scaled_rotate(self, layer: int, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """The base's rotation of layer ``layer``, then its queries times s log n (cast to q's dtype first, so
        a bf16 q is not promoted to a float32 copy)."""
        q, k = self.base.for_layer(layer).rotate(q, k, pos)
        return q * self.query_scale(layer, pos).to(q.dtype), k

    def for_layer(self, layer: int) -> "SSMaxLayer":
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"{self.name} has s for {self.n_layers} attention layer(s) (n_layers={self.n_layers}); "
                             f"layer {layer} has none: build it with the model's n_layers")
        return SSMaxLayer(self, layer)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.scaled_rotate(0, q, k, pos)

    def positions(self, batch: int, length: int, device: torch.device) -> torch.Tensor:
        return self.base.positions(batch, length, device)

    def embed(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.base.embed(x, pos)

    def set_eval_length(self, length: int) -> None:
        self.base.set_eval_length(length)

    def set_train_length(self, length: int) -> None:
        self.base.set_train_length(length)

    def set_eval_windows(self, windows: Optional[torch.Tensor]) -> None:
        self.base.set_eval_windows(windows)


class SSMaxLayer(LayerOf):
    """An SSMax row as attention layer ``layer`` sees it (``ScalableSoftmax.for_layer``): that layer's s (and b)."""

    def rotate(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoding.scaled_rotate(self.layer, q, k, pos)


def ssmax_row(base: type[Encoding]) -> type[ScalableSoftmax]:
    """The ``<base>+ssmax`` class: the base's options plus ``s_init`` and ``scale_bias`` (its __init__ signature
    says so, which is what ``encodings.build`` checks options against) and ``n_layers`` (a shape)."""
    params = [p for n, p in inspect.signature(base.__init__).parameters.items() if n not in ("self", "n_layers")]
    own = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d)
           for n, d in (("n_layers", 1), ("s_init", S_INIT), ("scale_bias", False))]
    signature = inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + params + own)

    def __init__(self, **kwargs) -> None:
        ScalableSoftmax.__init__(self, **kwargs)

    __init__.__signature__ = signature
    name = f"{base.__name__}SSMax"
    cls = type(name, (ScalableSoftmax,), {
        "__init__": __init__, "__module__": __name__, "base_cls": base, "family": base.family,
        "summary": f"{base.name} with Scalable-Softmax: queries x s log n, n the keys seen, s learned per layer "
                   f"and head; Nakanishi 2025",
        "paper": f"Nakanishi 2025, SSMax (arXiv:2501.19399), over {base.paper}",
        "positions_in_embedding": base.positions_in_embedding, "batched_positions": base.batched_positions,
    })
    globals()[name] = cls  # a module-level name: reprs and pickling find it
    return cls


def _register_rows() -> None:
    load_modules(before="ssmax")
    for base_name in BASES:
        why = refusal(REGISTRY[base_name])
        if why is not None:
            raise RuntimeError(f"ssmax: BASES names {base_name!r}, which SSMax cannot wrap: {why}")
        register(f"{base_name}+ssmax")(ssmax_row(REGISTRY[base_name]))


_register_rows()
