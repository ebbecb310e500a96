"""The base class of every positional encoding: the hooks the model calls, the capability flags that choose its
attention path, and the family names that group the rows in tables and figures.

The model only ever calls these hooks (``positions``, ``embed``, ``rotate``, ``bias`` and the optional ones its
capability flags announce) plus ``set_eval_length``; it never looks at an encoding's name. The attention plan
(``model/plan.py``) reads the flags, never the class.

The hooks, all defaulting to "do nothing":

- ``positions(batch, length, device)``: the positions of a window: (T,) 0 .. T-1 by default; an encoding
  may return (B, T) positions per sequence (``+rand`` does in training), then every hook gets those.
- ``embed(x, pos)``: x (B, T, C) token embeddings, pos (T,) or (B, T) positions -> (B, T, C).
- ``rotate(q, k, pos)``: q, k (B, H, T, D) -> rotated q, k.
- ``bias(q_pos, k_pos)``: additive attention logits (1 or B, H, Tq, Tk), or None: a new tensor each call (the
  model writes the chunk's mask into it, so no second (Tq, Tk) copy exists).
- optionally ``bias_factors(q_pos, k_pos)``: the same bias as a low-rank product (see there).
- optionally ``attention_logits(q, k, q_pos, k_pos, mask, scale)`` (``has_attention_logits``): the whole
  pre-softmax logits of one query chunk, for an encoding whose logits are not q . k plus a bias that reads
  positions only (CoPE reads q . k itself; ReRoPE and Self-Extend combine two rotations by distance).
- optionally ``attention_parts(q, k, q_pos, k_pos)`` (``has_attention_parts``): those logits as a few
  plain attentions over disjoint sets of pairs, which the model merges by log-sum-exp (faster, and no
  (q, k) logits in memory).
- optionally ``score_mod(q_pos, k_pos)`` (``has_score_mod``): ``bias`` as a FlexAttention score_mod, built
  from small tensors only, so a device with FlexAttention never builds the (q, k) bias (``model/flex.py``).
- optionally ``attention_output(q, k, v, q_pos, k_pos, mask, scale)`` (``has_attention_output``): softmax of
  those logits @ v by the encoding's own route (CoPE's hand-written backward).
- optionally ``for_tokens(x)`` (``reads_tokens``): the layer's view for this forward's hidden states x (B, T, C),
  the attention layer's input, for an encoding whose position signal is computed from the tokens (FoX's
  forget gates); the model calls it in every attention layer, after ``for_layer``.
- optionally ``attention_block(length)``: blockwise causal attention (each query sees its own block of
  that many tokens and the previous one), or None.
- ``set_window(window)``: the model's sliding window, told once when the model is built (``+ssmax`` counts the
  keys a query sees from it).
- ``tuning_grid`` and ``tuned_row`` (class methods, ``TuningHooks``): what ``eval.tune`` chooses a zero-shot
  row's options from on the valid split, and how a point is built (``bench/eval/tune.py``).
- ``attention_sinks`` (a class attribute, not a hook): (S, W) when the first S tokens stay visible beside a
  sliding window of W keys, with positions re-indexed within that cache (StreamingLLM); the model applies
  it through the hooks above (rows ``<encoding>+sink<S>+sw<W>``: ``encodings/sinks.py``; ``model/sinks.py``).

Positions count from 0 at the first token of every window. Hooks that take (B, T) positions declare
``batched_positions``; with the plain (T,) arange every encoding keeps its fast path.

The logits hook is the one extension point for attention that is not "q . k + bias(positions)": the model
runs it per query chunk (keys [ks, qe) of the chunk, ``mask`` the chunk's additive (1 or B, H or 1, q, k)
mask: -inf outside the causal/window/block set, plus ``bias`` where the encoding has one) and applies
softmax to what it returns, so memory stays bounded by the chunk size at any length. Encodings without it
stay on SDPA's kernels (the other paths of ``model/attention.py``).
"""

from __future__ import annotations

from typing import Callable, ClassVar, Optional

import torch
from torch import nn

# The groups the rows fall into in tables and figures, each with what its members share: every encoding class
# declares one of them (``Encoding.family``; ``registry.family`` reads and checks it).
FAMILIES = (
    "classic absolute",  # positions added to the token embeddings (Vaswani et al. 2017; GPT-2's learned table)
    "relative bias",  # a bias on the attention logits read from the query-key distance (T5, ALiBi, KERPLE, FIRE)
    "rotary",  # q and k rotated by their positions, trained so (RoPE and its trained variants: partial, xPos)
    "rotary scaling (zero-shot)",  # the trained RoPE model, its frequencies rescaled at evaluation (PI, NTK, YaRN)
    "rotary scaling (fine-tuned)",  # the same rescalings, fine-tuned at the longer length first
    "rotary fix (zero-shot)",  # the trained RoPE model with per-pair positions at evaluation (ReRoPE, Self-Extend)
    "attention sinks (zero-shot)",  # a trained model with a sliding window plus the first tokens (StreamingLLM)
    "contextual",  # positions or decays computed from the content itself (CoPE, FoX's forget gates)
    "randomized positions",  # a trained encoding that trains on sorted random positions (``+rand``)
    "none",  # no position signal but the causal mask (NoPE)
)

# The std every weight matrix and embedding table of the model starts with (GPT-2's; model/transformer.py's
# init, ``learned``'s table, and the scale ``sinusoidal`` puts its table at), shared by every encoding.
INIT_STD = 0.02


class TuningHooks:
    """What ``eval.tune`` (``bench/eval/tune.py``) asks of a row's class: the grid of its own options to choose
    among at one eval length, and the row that evaluates a point of it. Every encoding has them (``Encoding``)."""

    @classmethod
    def tuning_grid(cls, train_len: int, eval_len: int, options: dict) -> list[dict]:
        """The values of this row's own options that ``eval.tune`` chooses among on the valid split, at windows of
        ``eval_len`` tokens of a model trained at ``train_len`` (``bench/eval/tune.py``): a list of points, each
        a dict of the options it sets, the authors' default first (kept on a tie). ``options``: the row's
        configured ones, held: a point takes their values (the protocol then drops them from every point and
        merges equal points). [] (the default): nothing to tune there, a trained encoding or a fix that is plain
        rope at that length. A zero-shot fix declares its grid in its own file, the source of every value in its
        docstring."""
        return []

    @classmethod
    def tuned_row(cls, point: dict) -> tuple[str, dict]:
        """(registered encoding name, options) that evaluate grid point ``point``: this encoding with those
        options by default; a row whose tuned value is in its name (attention sinks' count) maps it here."""
        return cls.name, dict(point)


class PositionTraits:
    """What an encoding declares about the positions its hooks read: what ``+rand`` (``randomized.py``) needs
    to know to wrap it, and what the model needs to know of a layer's view with positions of its own; and the
    model's window, told to an encoding that counts the keys a query sees (``set_window``)."""

    # True when every position-reading hook accepts (B, T) positions (one row per sequence): the encodings
    # ``+rand`` can wrap.
    batched_positions: ClassVar[bool] = False
    # True for a layer's view (``for_layer``) whose positions are its own (``+rand``'s per-layer draws): the
    # model then plans that layer's attention from the view's ``positions`` instead of the forward's.
    own_positions: ClassVar[bool] = False
    # True when ``bias`` is a function of the distance i - j alone (a Toeplitz matrix: ALiBi, KERPLE, T5):
    # ``+rand`` then draws random distances, as its authors do for ALiBi, instead of random positions.
    distance_only: ClassVar[bool] = False
    # How ``+rand`` over this encoding evaluates by default: "random" positions, as Ruoss et al. 2023 do at
    # test time, or "ordered" (0 .. L-1) where the authors of the randomized recipe evaluate so (FIRE).
    randomized_eval: ClassVar[str] = "random"
    # ``+rand``'s M over the train length where the authors of the randomized recipe for this encoding set their
    # own (FIRE: mcleish7/arithmetic's 2); None: Ruoss et al.'s (``randomized.RATIO``).
    randomized_range: ClassVar[Optional[float]] = None
    # True when the attention reads the layer's hidden states (``for_tokens``): FoX's forget gates.
    reads_tokens: ClassVar[bool] = False
    # A layer view's own sliding window (a hybrid's RoPE layers): the model plans that layer's attention with it
    # instead of its own window; None: the model's.
    own_window: ClassVar[Optional[int]] = None

    def set_window(self, window: Optional[int]) -> None:
        """Called once by the model that holds the encoding with its sliding window W (None: every earlier key),
        for an encoding whose hooks depend on how many keys a query sees (SSMax's log min(i + 1, W))."""


class Encoding(TuningHooks, PositionTraits, nn.Module):
    """A positional encoding: the hooks the model calls (the module docstring lists them), all defaulting to
    "do nothing", and the capability flags that announce the optional ones."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    # The group a row belongs to in tables and figures: one of FAMILIES, declared by every encoding class (a
    # subclass inherits its base's unless it sets its own).
    family: ClassVar[str] = ""
    # The paper (or post) it comes from, short: authors, year, venue or arXiv id.
    paper: ClassVar[str] = ""
    # True for a trained encoding newer than the classic six (sinusoidal, learned, T5, RoPE, ALiBi, NoPE) that
    # the length-generalisation literature compares today: figures draw these in a panel of their own.
    newer: ClassVar[bool] = False
    # An eval-only variant names the trained encoding whose checkpoint it reuses (e.g. rope-linear -> rope).
    trained_as: ClassVar[Optional[str]] = None
    # A fine-tuned variant (e.g. rope-linear-ft): the runner first continues training the trained_as checkpoint
    # at the fine-tune length (config finetune), calling set_train_length(that length) before it and before eval.
    finetuned: ClassVar[bool] = False
    # True when bias() returns a tensor; the model then takes the masked SDPA path instead of the fused causal one,
    # unless the encoding also implements bias_factors (then has_low_rank_bias is True).
    has_bias: ClassVar[bool] = False
    # True when bias_factors() returns factors: the model folds the bias into extra q/k channels and keeps
    # SDPA's fused kernels and no (Tq, Tk) bias tensor is ever built.
    has_low_rank_bias: ClassVar[bool] = False
    # True when distance_bias(T) returns r (H, W + 1) with bias(i, j) = r[h, min(i - j, W)] for windows of T
    # tokens: training then keeps SDPA's flash kernel and sums r's gradient over diagonals (model/distance_bias.py).
    has_distance_bias: ClassVar[bool] = False
    # False: a learned bias trains on SDPA's mask path, not the bias kernel (model/distance_bias.py): time's reference
    bias_kernel: ClassVar[bool] = True
    # True when attention_logits() computes a chunk's whole pre-softmax logits (the model then runs attention
    # explicitly, chunk by chunk, instead of through SDPA).
    has_attention_logits: ClassVar[bool] = False
    # True when attention_parts() splits those logits into ordinary attentions over disjoint sets of pairs:
    # the model then runs each through SDPA's kernel and merges them by log-sum-exp (no (q, k) logits).
    has_attention_parts: ClassVar[bool] = False
    # True when attention_output() computes a chunk's softmax(attention_logits) @ v itself (with
    # ``has_attention_logits``), e.g. with a backward that recomputes the logits instead of saving them (CoPE).
    has_attention_output: ClassVar[bool] = False
    # True when positions enter through ``embed`` (added to the token embeddings): a key's position is then part of
    # its hidden state in every layer, so attention cannot re-index it (no attention-sink rows).
    positions_in_embedding: ClassVar[bool] = False
    no_sinks: ClassVar[str] = ""  # why it takes no attention sinks, a clause sinks.py prints ("": it takes them)
    # (S, W): the first S tokens are always visible beside a sliding window of the last W keys (W None: the
    # model's window), and a query past the first S + W tokens sees the sinks at the positions they have in
    # that cache (StreamingLLM; model/sinks.py applies it). None: no sinks.
    attention_sinks: ClassVar[Optional[tuple[int, Optional[int]]]] = None

    def __init__(self, *, d_model: int, n_heads: int, train_len: int) -> None:
        super().__init__()
        self.d_model, self.n_heads, self.train_len = d_model, n_heads, train_len
        self.head_dim = d_model // n_heads

    def set_eval_length(self, length: int) -> None:
        """Called before evaluating windows of ``length`` tokens; raise PositionOutOfRange if impossible."""

    def set_train_length(self, length: int) -> None:
        """Called before fine-tuning (and evaluating) a fine-tuned variant tuned at ``length`` tokens."""

    # Options that only choose how the encoding is evaluated (``+rand``'s eval positions): never in the cell key
    eval_option_names: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def eval_options(cls, options: dict) -> dict:
        """Resolved eval-time options that make this row's numbers (eval key, records); {}: evaluated as ever."""
        return {}

    @classmethod
    def key_options(cls, train_len: int, options: dict) -> dict:
        """Resolved options that determine the trained weights beyond the configured ones (e.g. ``+rand``'s
        position range, a multiple of the train length by default): part of the cell key when not empty."""
        return {}

    def for_layer(self, layer: int) -> "Encoding":
        """The encoding as attention layer ``layer`` sees it: itself, or that layer's view (CoPE's tables)."""
        return self

    def for_tokens(self, x: torch.Tensor) -> "Encoding":
        """Optional (``reads_tokens``): the view for hidden states x (B, T, C), the layer's normalised input."""
        return self

    def set_eval_windows(self, windows: Optional[torch.Tensor]) -> None:
        """Called before each eval forward with the run-wide index (B,) int64 of each window in the batch (None
        after evaluation): an encoding whose eval positions are random (``+rand``) seeds them by window, so
        every run scores the same positions."""

    def positions(self, batch: int, length: int, device: torch.device) -> torch.Tensor:
        """The positions of a window of ``length`` tokens: (T,) 0 .. T-1, or (B, T) positions per sequence."""
        return torch.arange(length, device=device)

    def embed(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return x

    def rotate(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> Optional[torch.Tensor]:
        return None

    def bias_factors(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """Optional: float64 factors qf (H, Tq, E), kf (H, Tk, E) with qf @ kf^T = bias(q_pos, k_pos)[0] + c,
        where c may vary per query row (softmax ignores it). Keep the product small near the diagonal (e.g.
        centre positions on the query chunk): the model adds it to float logits."""
        return None

    def distance_bias(self, length: int) -> Optional[torch.Tensor]:
        """Optional: r (H, W + 1) such that bias(q_pos, k_pos) = r[h, min(i - j, W)] for every visible key of a
        window of ``length`` tokens (W >= length - 1 for a bias that never saturates)."""
        return None

    def attention_logits(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                         mask: torch.Tensor, scale: float) -> torch.Tensor:
        """Optional (``has_attention_logits``): the pre-softmax logits (B, H, q, k) of one query chunk, mask
        included. q (B, H, q, D), k (B, H, k, D) are what ``rotate`` returned (an encoding that rotates per
        pair, e.g. ReRoPE, returns them unrotated there and rotates here); positions as in ``bias``."""
        return (q @ k.transpose(-1, -2)).float() * scale + mask

    def attention_output(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor,
                         k_pos: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
        """Optional (``has_attention_output``): softmax(attention_logits(q, k, q_pos, k_pos, mask, scale)) @ v
        (B, H, q, D) of one query chunk, the same values by a faster or leaner route."""
        raise NotImplementedError

    def attention_parts(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
                        ) -> list[tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]]:
        """Optional (``has_attention_parts``, with ``has_attention_logits``): the same attention as
        ``attention_logits`` when its logits are, pair by pair, one of a few plain products q' . k': a list of
        parts (q' (B, H, q, D), k' (B, H, n, D), first, pairs (q, n) bool): k' are keys [first, first + n) of
        the chunk's, and ``pairs`` marks the pairs of this part; every visible pair belongs to one part. The
        model runs each part with the chunk's mask as one attention and merges them exactly by their
        log-sum-exp, never building the (q, k) logits (ReRoPE, Self-Extend: pairs within and beyond w)."""
        raise NotImplementedError

    def attention_block(self, length: int) -> Optional[int]:
        """Optional: blockwise causal attention for windows of ``length`` tokens: queries in block
        b = i // n see keys from block b - 1 on (n returned), or None (plain causal attention)."""
        return None

    # True when score_mod() gives the bias as a FlexAttention score_mod: on a device with FlexAttention the
    # model then attends in one fused kernel that adds the bias pair by pair (model/flex.py), no (q, k) bias.
    has_score_mod: ClassVar[bool] = False

    def score_mod(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> Optional[Callable]:
        """Optional (``has_score_mod``): ``bias(q_pos, k_pos)`` as a FlexAttention score_mod
        (score, b, h, q_idx, kv_idx) -> score + the bias of head h between the q_idx-th query and the kv_idx-th
        key of these positions ((q,), (k,) or (B, q), (B, k)), built from small tensors only, never (q, k)
        (``pair_score_mod`` makes one from a function of positions). FlexAttention (Dong et al. 2024,
        arXiv:2412.05496) calls it on 0-d tensors inside its kernel; on CUDA gradients reach the tensors it
        captures."""
        return None


class LayerOf:
    """``encoding`` as attention layer ``layer`` sees it (``Encoding.for_layer``): what a subclass defines (that
    layer's table, gate or coefficients), everything else (hooks, capability flags, sizes, the attention sinks of
    a sink row) read from the whole encoding, so the attention plan treats it as the encoding itself. Not a
    module: the parameters stay in the encoding. The explicit paths and ``rotate`` call the layer's view
    (``model/plan.Chunk.encoding``), so each layer attends with its own."""

    def __init__(self, encoding: Encoding, layer: int) -> None:
        self.encoding, self.layer = encoding, layer

    def __getattr__(self, name: str):  # only for what this class does not define
        return getattr(self.encoding, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.encoding.name}, layer={self.layer})"


class TokenReading(Encoding):
    """An encoding whose attention logits are computed from each layer's hidden states (FoX's forget gates, PaTH's
    Householder transformations): per-layer parameters for ``n_layers`` layers, and the explicit-logits path. A
    subclass defines ``read(x, layer)``, what it computes from the layer's input x (B, T, C), and
    ``logits_of(state, q, k, q_pos, k_pos, mask, scale)``, a query chunk's logits from that state. The model asks
    each layer's view (``for_layer``, then ``for_tokens``); as itself the encoding is layer 0 (as CoPE's base is),
    which is what a one-layer caller (``posenc-bench time``) attends with."""

    has_attention_logits = True  # the model plans the explicit-logits path; each layer's view computes them
    reads_tokens = True
    n_layers: int

    def for_layer(self, layer: int) -> "TokenLayer":
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer {layer} out of range: this {self.name} has parameters for layers "
                             f"0..{self.n_layers - 1}")
        return TokenLayer(self, layer)

    def for_tokens(self, x: torch.Tensor) -> "TokenState":
        return self.for_layer(0).for_tokens(x)

    def attention_logits(self, q, k, q_pos, k_pos, mask, scale):
        raise RuntimeError(f"{self.name}'s logits need a layer's hidden states: ask for_layer(i).for_tokens(x) (the "
                           f"model does, in every attention layer)")

    def read(self, x: torch.Tensor, layer: int):
        """What layer ``layer``'s attention needs from its hidden states x (B, T, C)."""
        raise NotImplementedError

    def logits_of(self, state, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                  mask: torch.Tensor, scale: float) -> torch.Tensor:
        """(B, H, q, k) float32 logits of one query chunk, mask included, from ``read``'s ``state``."""
        raise NotImplementedError


class TokenLayer(LayerOf):
    """A ``TokenReading`` encoding as attention layer ``layer`` sees it: it reads the layer's hidden states."""

    def for_tokens(self, x: torch.Tensor) -> "TokenState":
        return TokenState(self.encoding, self.layer, self.encoding.read(x, self.layer))


class TokenState(LayerOf):
    """One layer's ``TokenReading`` encoding for one forward: ``state``, what it read from the hidden states, for
    ``attention_logits`` (the explicit-logits path)."""

    reads_tokens = False

    def __init__(self, encoding: TokenReading, layer: int, state) -> None:
        super().__init__(encoding, layer)
        self.state = state

    def attention_logits(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                         mask: torch.Tensor, scale: float) -> torch.Tensor:
        return self.encoding.logits_of(self.state, q, k, q_pos, k_pos, mask, scale)


# The attribute ``consecutive_start`` memoizes its answer under, on the positions tensor itself.
_START_MEMO = "_posenc_consecutive_start"


def consecutive_start(pos: torch.Tensor) -> Optional[int]:
    """pos[0] when pos is start, start + 1, ... (what the model passes), else None: an encoding can then take
    a slice of its tables instead of gathering rows (the same values, without the copy).

    The answer needs the values (a host sync on a GPU, and a graph break under ``torch.compile``), so it is
    worked out once per tensor and memoized on it: the model asks once per forward, before its blocks, and
    every layer's ``rotate`` (and ``embed``) then reads the memo, on the host, with no sync. Positions are
    never modified in place (every hook takes them read-only); a slice is a new tensor, asked afresh."""
    if pos.dim() != 1 or not pos.shape[0]:
        return None
    memo = getattr(pos, _START_MEMO, None)
    if memo is not None:
        return memo[0]
    start = int(pos[0])
    if not torch.equal(pos, torch.arange(start, start + pos.shape[0], device=pos.device, dtype=pos.dtype)):
        start = None
    setattr(pos, _START_MEMO, (start,))  # a 1-tuple: "not consecutive" (None) is memoized too
    return start


def pair_score_mod(bias_at: Callable, q_pos: torch.Tensor, k_pos: torch.Tensor) -> Callable:
    """A FlexAttention score_mod from ``bias_at(h, i, j)``, the bias of head h for a query at position i and a key
    at j (0-d tensors): each index is looked up in the chunk's positions, (q,), (k,) or per sequence (B, q),
    (B, k) (``+rand``), so offsets and random positions need nothing else; (1, q), (1, k) are shared by the batch."""
    if q_pos.dim() == 2 and q_pos.shape[0] == 1:  # one row for every sequence (+rand's per-layer draws)
        q_pos, k_pos = q_pos[0], k_pos[0]
    if q_pos.dim() == 1:
        return lambda score, b, h, q_idx, kv_idx: score + bias_at(h, q_pos[q_idx], k_pos[kv_idx])
    return lambda score, b, h, q_idx, kv_idx: score + bias_at(h, q_pos[b, q_idx], k_pos[b, kv_idx])


def toeplitz_bias(values, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """(1, H, Tq, Tk) bias whose entry (a, b) is values(d)[:, a, b] for d = q_pos[a] - k_pos[b] >= 0 (0 for
    future keys, which the mask hides). ``values`` maps distances (N,) to (H, N). Consecutive positions need
    one value per distance (a line of Tq + Tk - 1, read as a Toeplitz view, then one copy that flips it into
    place); others, every pair. KERPLE's kernel and T5's buckets are read this way."""
    Tq, Tk = q_pos.shape[-1], k_pos.shape[-1]
    q0, k0 = consecutive_start(q_pos), consecutive_start(k_pos)  # memoized: no host sync for the model's positions
    if q0 is not None and k0 is not None:
        d = q0 - k0 + torch.arange(-(Tk - 1), Tq, device=q_pos.device)
        line = values(d.clamp(min=0))  # (H, Tq + Tk - 1): line[h, a + c] is distance a - (Tk - 1 - c)
        toeplitz = line.as_strided((line.shape[0], Tq, Tk), (line.stride(0), 1, 1))
        return toeplitz.flip(-1).unsqueeze(0)  # (1, H, Tq, Tk)
    distance = (q_pos[..., :, None] - k_pos[..., None, :]).clamp(min=0)  # (Tq, Tk) or (B, Tq, Tk)
    out = values(distance.reshape(-1)).view(-1, *distance.shape)  # (H, [B,] Tq, Tk)
    return out.unsqueeze(0) if distance.dim() == 2 else out.transpose(0, 1)  # (1 or B, H, Tq, Tk)
