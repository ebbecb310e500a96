"""A Hugging Face RoPE model's attention run through one of our encodings: the zero-shot fixes on HF models.

transformers rotates q and k inside each attention module from one position per token, so only a change of
its frequencies (``hf/rope.py``) reaches it. ReRoPE, Leaky ReRoPE and Self-Extend give each query-key pair
its own relative position, and attention sinks re-index the cache; all of them are rows of the trained
``rope`` model in ``encodings/`` (``rope_fixes.py``, ``sinks.py``). To run them on a Hugging Face model:

1. its rotary modules are swapped for ``_NoRotation``, whose cos = 1 and sin = 0 make transformers'
   ``apply_rotary_pos_emb`` return q and k unchanged (q * 1 + rotate_half(q) * 0 = q, exactly);
2. its attention implementation becomes ``"posenc"``: ``posenc_attention`` gets those unrotated q, k
   (and v) with the key/value heads repeated for grouped-query attention, and runs ``model.attention.attend``
   along an ``AttentionPlan`` of our encoding, built with the model's head layout and its own ``inv_freq``;
3. the causal mask transformers would build (an (L, L) tensor: 4 GiB at 32k tokens) is skipped: our plan
   builds the masks chunk by chunk.

So a Hugging Face model and our own models go through the same code for these rows. Only RoPE models whose
attention modules call ``ALL_ATTENTION_FUNCTIONS`` with the rotated q, k (Llama, Mistral, Qwen2, SmolLM2
and most others in transformers 5) and whose rotation is the unscaled default one over the whole head
(no ``partial_rotary_factor``) are rerouted; ``build_encoding`` raises, naming why, for any other.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch

from posenc_bench import encodings
from posenc_bench.errors import ConfigError, PosencError
from posenc_bench.encodings.rope import default_inv_freq
from posenc_bench.model.attention import AttentionPlan, attend

IMPLEMENTATION = "posenc"
MAX_LOGIT_BYTES = 1 << 30  # logits of one query chunk of the explicit paths (AttentionPlan's max_mask_bytes)


class _NoRotation(torch.nn.Module):
    """Stands in for a rotary module: cos = 1, sin = 0, the shapes and dtype transformers expects."""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (*position_ids.shape, self.head_dim)  # (b, L, head_dim)
        return torch.ones(shape, dtype=x.dtype, device=x.device), torch.zeros(shape, dtype=x.dtype, device=x.device)


class Rerouted:
    """One of our rope-family encodings on a Hugging Face model's head layout: what ``posenc_attention`` runs.

    ``plan(T, start)`` is built once per forward (all layers share it, as in our model) for keys at positions
    0 .. T - 1 and queries at start .. T - 1: a whole window (start 0), or the tokens that continue a KV cache
    of ``start`` tokens, whose keys the cache holds unrotated (step 1 below) and whose queries the plan's chunks
    skip."""

    def __init__(self, encoding: encodings.Encoding) -> None:
        self.encoding = encoding
        self._plan: Optional[tuple[tuple, AttentionPlan]] = None

    def plan(self, T: int, batch: int, device: torch.device, start: int = 0) -> AttentionPlan:
        key = (T, batch, device, start)
        if self._plan is None or self._plan[0] != key:
            pos = torch.arange(T, device=device)
            self._plan = (key, AttentionPlan(self.encoding, pos, None, MAX_LOGIT_BYTES, batch, queries_from=start))
        return self._plan[1]


def _heads(config) -> tuple[int, int]:
    """(query heads, head dimension) of a transformers config."""
    heads = config.num_attention_heads
    return heads, getattr(config, "head_dim", None) or config.hidden_size // heads


def build_encoding(name: str, config, rotary: list[tuple[torch.nn.Module, str, torch.nn.Module]], train_len: int,
                   **options) -> encodings.Encoding:
    """Our encoding ``name`` (rope, or a zero-shot row of the trained rope model, with its ``options``) on the
    heads and frequencies of a model with this config and these rotary modules (``hf.model.rotary_embeddings``)."""
    if len(rotary) != 1:
        raise PosencError(f"{name} reroutes a model with one rotary module; this one has {len(rotary)}")
    rotary = rotary[0][2]
    cls = encodings.get_class(name)
    if name != "rope" and cls.trained_as != "rope":
        raise ConfigError(f"{name!r} is not a zero-shot row of the trained rope model; Hugging Face models take "
                          f"{', '.join(n for n in encodings.available() if encodings.get_class(n).trained_as == 'rope')}")
    heads, head_dim = _heads(config)
    theta = float(config.rope_parameters["rope_theta"])
    enc = cls(d_model=heads * head_dim, n_heads=heads, train_len=train_len, theta=theta, **options)
    if not torch.equal(enc.inv_freq, rotary.inv_freq.detach().cpu().float()) or rotary.attention_scaling != 1.0:
        raise PosencError(f"{type(rotary).__name__}'s frequencies are not the default theta^(-2i/d) with theta {theta} "
                          f"over head_dim {head_dim} (a scaled or partial rotation): {name} needs the unscaled one")
    return enc


def posenc_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                     posenc: Optional[Rerouted] = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: query (b, H, L, D), key/value (b, H_kv, T, D), unrotated (step 1 of
    the module docstring), T >= L: the queries are the last L of T tokens at positions T - L .. T - 1 (T > L
    where they continue a KV cache of the first T - L) -> (b, L, H, D)."""
    if posenc is None:
        raise ConfigError(f"attention implementation {IMPLEMENTATION!r} needs posenc=Rerouted(...) in the forward's kwargs")
    B, H, L, D = query.shape
    T = key.shape[2]
    position_ids = kwargs.get("position_ids")
    if T < L or (position_ids is not None and not torch.equal(
            position_ids, torch.arange(T - L, T, device=position_ids.device).expand_as(position_ids))):
        raise ConfigError("rerouted attention scores queries at the positions that follow their keys' (a whole "
                          "window from position 0, or a KV cache continued from its end)")
    groups = H // key.shape[1]
    key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))  # (b, H_kv, T, D) -> (b, H, T, D)
    if T > L:  # the cached tokens' queries are never attended (the plan's chunks start at T - L): zeros
        query = torch.cat((query.new_zeros(B, H, T - L, D), query), dim=2)  # (b, H, T, D)
    scale = scaling if scaling is not None else D ** -0.5
    y = attend(posenc.encoding, posenc.plan(T, B, query.device, T - L), query, key, value, scale)  # (b, H, L, D)
    return y.transpose(1, 2).contiguous(), None  # (b, L, H, D)


def _no_mask(*args, **kwargs) -> None:  # the plan masks its chunks itself
    return None


def register() -> None:
    """Make ``"posenc"`` an attention implementation of transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, posenc_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, _no_mask)


@contextlib.contextmanager
def rerouted(model: torch.nn.Module, rotary: list[tuple[torch.nn.Module, str, torch.nn.Module]]) -> Iterator[None]:
    """Inside: ``model``'s rotary modules give the identity rotation and its attention is ``posenc_attention``
    (the forward must pass ``posenc=``); the originals are put back after."""
    register()
    config = model.config
    head_dim = _heads(config)[1]
    before = config._attn_implementation
    try:
        for parent, attr, module in rotary:
            setattr(parent, attr, _NoRotation(head_dim))
        config._attn_implementation = IMPLEMENTATION
        yield
    finally:
        config._attn_implementation = before
        for parent, attr, module in rotary:
            setattr(parent, attr, module)


def is_plain_rope(encoding: encodings.Encoding, length: int) -> bool:
    """After ``set_eval_length(length)``: does the encoding attend exactly as the unscaled model at this length
    (default frequencies, the fused causal path: no per-pair positions, no sinks)? Then the row's numbers are
    the model's own."""
    inv_freq, scale = default_inv_freq(encoding.head_dim, encoding.theta)
    plan = AttentionPlan(encoding, torch.arange(length), None, MAX_LOGIT_BYTES)
    return plan.path == "fused" and torch.equal(encoding.inv_freq, inv_freq) and encoding.attention_scale == scale


def describe(encoding: encodings.Encoding) -> dict:
    """What a rerouted record ran: the encoding and the options it was set to at this length."""
    keys = ("theta", "window", "slope", "neighbor_window", "group", "shift", "local_window", "attention_factor",
            "attention_sinks")
    return {"encoding": encoding.name, **{k: getattr(encoding, k) for k in keys if getattr(encoding, k, None) is not None}}
