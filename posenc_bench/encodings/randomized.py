"""Randomized positional encodings: ``<encoding>+rand``, as their authors' code draws them.

Ruoss, Deletang, Genewein, Grau-Moya, Csordas, Bennani, Legg & Veness, "Randomized Positional Encodings Boost
Length Generalization of Transformers", ACL 2023 (arXiv:2305.16843); code google-deepmind/
randomized_positional_encodings at commit e8c6474 (cited by file). A model trained on short sequences meets
positions (or distances) up to M, larger than any test length, so none is new at test time. How their code
draws them, which ``sampler: authors`` (the default) follows:

- **One draw per forward call, shared by every sequence of the batch.** ``noisy_fixed_positional_encodings``
  (``models/positional_encodings.py``) samples ``sequence_length`` indices of ``arange(noise_max_length)``
  without replacement (``jrandom.choice(..., replace=False)``) and sorts them; the batch dimension is never
  sampled. Here: positions (1, T), broadcast over the batch.
- **Absolute encodings (sin/cos, learned): one draw per forward**, in ``add_positional_encodings``
  (``models/transformer.py``, NOISY_SIN_COS, NOISY_LEARNT; the learned table has ``noise_max_length`` rows).
- **Rotary and relative encodings: a fresh draw in every attention layer**: each attention call takes
  ``hk.next_rng_key()`` (``models/transformer.py``, ``MultiHeadDotProductAttention.__call__``: NOISY_ROTARY
  rotates q and k with the same key, so the same positions within a layer). Here: ``for_layer(i)`` returns a
  view holding layer i's draw, and the model plans that layer's attention from it (``own_positions``).
- **Distance biases (ALiBi, and KERPLE here): sorted random distances, so the bias stays a function of i - j.**
  ``compute_noisy_alibi_encodings_biases`` draws ``max(q, k) - 1`` distances from ``arange(1,
  noise_max_length)`` without replacement, sorts them and places them by ``relative_shift``: distance d becomes
  s_d (s_0 = 0, s_1 < s_2 < ...). ``compute_attention_with_noisy_relative_encodings`` does the same for the
  Transformer-XL relative encoding. Here every encoding whose bias is a function of the distance alone
  (``distance_only``) gets that: the bias between slots i >= j is the base's bias at distance s_{i-j}, a
  Toeplitz matrix (its non-causal code adds 0.5 to one side to break left/right symmetry, which a causal
  model has no use for; it is not taken).
- **M** (``noise_max_length``) is 2048 for training lengths up to 40 (``experiments/example.py``:
  ``'noise_max_length': 2048``, ``sequence_length`` 40): M defaults to that ratio, ceil(2048 / 40 x the train
  length) (``RATIO``), or to the ratio the base's own randomized recipe sets (``Encoding.randomized_range``:
  FIRE's, below). Option ``max_position`` sets it.
- **At test time too** (``experiments/range_evaluation.py`` calls the same ``apply`` with a fresh rng per
  sub-batch; the maintainers confirm it in the repository's issue 1): ``eval_positions: random`` (the default)
  draws the positions of every layer for each eval length from a generator seeded by the row (its name), the
  length, the layer and ``eval_seed``: every window of that length, every seed of the row and every batch size
  scores the same positions (the authors draw per sub-batch: ``eval_seed`` gives another draw).
  ``eval_positions: ordered`` evaluates at 0 .. L-1.

``fire+rand`` is FIRE with randomized positions as mcleish7/arithmetic runs it (McLeish et al. 2024; class
``FIRE`` of ``cramming/architectures/embeddings.py`` lines 455-464 at commit 86022a5): one sorted draw per
forward of each layer's FIRE module, shared by the batch, in training only; evaluation is at 0 .. L-1 (there
``max_length = seq_length`` when not training, so the permutation keeps every position). Its base declares
that (``Encoding.randomized_eval``), so ``eval_positions`` defaults to ``ordered`` for it, and its M, 2 x the
train length (``Encoding.randomized_range``: their README's ``max_length=128`` over 64-token additions; FIRE
normalizes a distance by the query's position, so a model trained at Ruoss et al.'s 51 x and evaluated at
0 .. L-1 reads distances it never trained on).

``sampler: per-sequence`` keeps this benchmark's earlier variant, documented here and nowhere the default: one
sorted sample per sequence (positions (B, T)), the same positions in every layer, positions (not distances)
for the distance biases (so ALiBi's bias is not Toeplitz), M = ``PER_SEQUENCE_MULTIPLE`` x the train length,
and at evaluation a sample per window seeded by the window's run-wide index (``set_eval_windows``). The
sampler is in the cell key: no checkpoint of one is taken for the other.

The paper's claim is about algorithmic tasks (its length-generalization benchmark); a perplexity row tests
whether it carries over to language modelling, a different claim. A row with attention sinks evaluates at
0 .. L-1 (its positions are those of the cache), and L must not exceed M (n/a past it).

One loop registers ``<name>+rand`` for every trained encoding registered before this module (``registry.MODULES``
lists it after them) whose hooks take per-sequence positions (``batched_positions``), so a new such encoding gets its
row without a list kept here. The wrapped encoding is built with the same options and random stream as the
plain one (identical initial parameters); an encoding with a ``max_positions`` option (``learned``) gets M, so
``learned+rand``'s table has M rows and is ``n/a`` past them. The draws of each training forward come from a
generator seeded by the encoding's seed, a forward counter saved with the weights and the layer, so a resumed
run draws the positions an uninterrupted one draws.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from typing import ClassVar, Optional

import torch

from posenc_bench.encodings.base import Encoding, pair_score_mod, toeplitz_bias
from posenc_bench.encodings.registry import REGISTRY, listing_order, load_modules, register
from posenc_bench.errors import PositionOutOfRange

RATIO = 2048 / 40  # the authors' noise_max_length over their longest training length (experiments/example.py)
PER_SEQUENCE_MULTIPLE = 8  # the earlier variant's M, a multiple of the train length
SAMPLERS = ("authors", "per-sequence")
EVAL_POSITIONS = ("random", "ordered")  # the authors' sorted samples at test time, or 0 .. L-1


def resolve_range(train_len: int, max_position: int, sampler: str = "authors", ratio: Optional[float] = None) -> int:
    """M: max_position, or the sampler's default multiple of the train length when it is 0 (under the authors'
    sampler: ``ratio``, the base's own, else ``RATIO``)."""
    if max_position < 0 or (max_position and max_position < train_len):
        raise ValueError(f"max_position must be 0 (the default: {default_range_rule(sampler, ratio)}) or >= the "
                         f"train length {train_len}, got {max_position}")
    if max_position:
        return max_position
    return math.ceil((ratio or RATIO) * train_len) if sampler == "authors" else PER_SEQUENCE_MULTIPLE * train_len


def default_range_rule(sampler: str, ratio: Optional[float] = None) -> str:
    if sampler != "authors":
        return f"{PER_SEQUENCE_MULTIPLE} x train length"
    return f"ceil({ratio:g} x train length)" if ratio else "ceil(2048 / 40 x train length)"


def sorted_sample(batch: int, length: int, high: int, generator: torch.Generator, low: int = 0) -> torch.Tensor:
    """(batch, length) int64: each row a sorted sample without replacement from [low, high)."""
    keys = torch.rand(batch, high - low, generator=generator)
    return keys.topk(length, dim=-1).indices.sort(dim=-1).values + low


def seeded(*ident) -> torch.Generator:
    """A generator seeded by a hash of ``ident``: no two identities share a stream by arithmetic accident."""
    digest = hashlib.sha256("|".join(map(str, ident)).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)


def scheme_of(base: type[Encoding]) -> str:
    """How the authors' code randomizes this kind of encoding: "forward" (positions added to the embeddings:
    one draw per forward), "distances" (a bias of i - j alone: sorted random distances, per layer) or "layer"
    (rotations and other position-reading biases: sorted random positions, per layer)."""
    if base.positions_in_embedding:
        return "forward"
    return "distances" if base.distance_only else "layer"


def draw_range(enc: "Randomized", length: int) -> int:
    """The top of the range a draw of ``length`` positions of ``enc`` takes: M; in training, a window longer than
    M draws from [0, T), every position (mcleish7's FIRE: "max length will be increased to max sequence length if
    max length is short", embeddings.py line 456; Ruoss et al.'s M always exceeds their lengths). At random eval
    a window past M is refused (``Randomized.set_eval_length``)."""
    return max(enc.max_position, length) if enc.training else enc.max_position


class Randomized(Encoding):
    """The wrapper: ``base`` holds the wrapped encoding; every hook is the base's, with the positions above."""

    base_cls: ClassVar[type[Encoding]]
    family = "randomized positions"
    # options that choose only how the trained model is evaluated: never in the cell key (``bench.keys``)
    eval_option_names: ClassVar[tuple[str, ...]] = ("eval_positions", "eval_seed")

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, max_position: int = 0,
                 sampler: str = "authors", eval_positions: str = "", eval_seed: int = 0, **options) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len)
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
        self.sampler = sampler
        self.max_position = resolve_range(train_len, max_position, sampler, self.base_cls.randomized_range)
        eval_positions = eval_positions or self.default_eval_positions(sampler)
        if eval_positions not in EVAL_POSITIONS:
            raise ValueError(f"eval_positions must be one of {', '.join(EVAL_POSITIONS)}, got {eval_positions!r}")
        self.eval_positions, self.eval_seed = eval_positions, int(eval_seed)
        self.scheme = scheme_of(self.base_cls) if sampler == "authors" else "sequence"
        if "max_positions" in inspect.signature(self.base_cls.__init__).parameters:
            options["max_positions"] = self.max_position
        self.base = self.base_cls(d_model=d_model, n_heads=n_heads, train_len=train_len, **options)
        self._seed = int(torch.randint(0, 2**62, ()))  # drawn after the base: its parameters are the plain ones
        self.register_buffer("draws", torch.zeros(1, dtype=torch.int64))  # training forwards so far
        self._windows: Optional[torch.Tensor] = None
        self._forward: Optional[tuple[int, int, torch.device]] = None  # (draw, T, device) of the current forward

    @classmethod
    def default_eval_positions(cls, sampler: str) -> str:
        """The base's authors' choice (``Encoding.randomized_eval``: FIRE evaluates at 0 .. L-1) under their
        sampler; the per-sequence variant evaluates at random positions, as it always did."""
        return cls.base_cls.randomized_eval if sampler == "authors" else "random"

    @classmethod
    def key_options(cls, train_len: int, options: dict) -> dict:
        sampler = options.get("sampler", "authors")
        resolved = {**cls.base_cls.key_options(train_len, options),
                    "max_position": resolve_range(train_len, int(options.get("max_position", 0)), sampler,
                                                  cls.base_cls.randomized_range)}
        return {**resolved, "sampler": sampler}

    @classmethod
    def eval_options(cls, options: dict) -> dict:
        """The eval-time options that make this row's numbers, resolved: {} where it evaluates at 0 .. L-1 (the
        numbers of before, ``ordered``, or a row with attention sinks)."""
        order = options.get("eval_positions") or cls.default_eval_positions(options.get("sampler", "authors"))
        if order == "ordered" or cls.attention_sinks is not None:
            return {}
        return {"eval_positions": order, "eval_seed": int(options.get("eval_seed", 0))}

    def _random_eval(self) -> bool:
        return self.eval_positions == "random" and self.attention_sinks is None

    def set_eval_windows(self, windows: Optional[torch.Tensor]) -> None:
        self._windows = None if windows is None else windows.detach().to("cpu", torch.int64)

    def eval_generator(self, window: int, length: int) -> torch.Generator:
        """The per-sequence variant's generator of one evaluated window's positions: seeded by the row (its
        name), the window, its length and ``eval_seed``; nothing of the model's seed, so a checkpoint loaded
        anywhere scores the positions it scored, and the seeds of a row are scored on the same positions."""
        return seeded(self.name, self.eval_seed, window, length)

    def _generator(self, layer: int) -> torch.Generator:
        """The authors' sampler's generator of this forward's draw for ``layer`` (-1: the forward's own draw):
        in training seeded by the encoding's seed and the forward's index; in evaluation by the row, the eval
        seed and the length, so every window of a length is scored on the same positions."""
        draw, length, _ = self._forward
        if self.training:
            return seeded(self._seed, draw, layer)
        return seeded(self.name, self.eval_seed, length, layer)

    def _drawn(self) -> bool:
        """Whether this forward's positions are drawn (training, or random evaluation), not 0 .. L-1."""
        return self.training or self._random_eval()

    def positions(self, batch: int, length: int, device: torch.device) -> torch.Tensor:
        draw = int(self.draws)
        if self.training:
            with torch.no_grad():
                self.draws += 1
        self._forward = (draw, length, device)
        if self.scheme == "sequence":
            return self._sequence_positions(batch, length, device, draw)
        if self.scheme == "forward" and self._drawn():  # (1, T): one draw, broadcast over the batch
            return sorted_sample(1, length, draw_range(self, length), self._generator(-1)).to(device)
        return torch.arange(length, device=device)  # the per-layer views hold the drawn positions

    def _sequence_positions(self, batch: int, length: int, device: torch.device, draw: int) -> torch.Tensor:
        if not self.training:
            if not self._random_eval():
                return torch.arange(length, device=device)
            # windows the evaluation did not name (a direct forward, passkey): numbered 0 .. B-1 in the batch
            windows = self._windows if self._windows is not None else torch.arange(batch)
            if windows.numel() != batch:
                raise ValueError(f"set_eval_windows gave {windows.numel()} windows for a batch of {batch}")
            rows = [sorted_sample(1, length, self.max_position, self.eval_generator(int(w), length)) for w in windows]
            return torch.cat(rows).to(device)  # (B, T)
        generator = torch.Generator().manual_seed(self._seed + draw)
        return sorted_sample(batch, length, draw_range(self, length), generator).to(device)  # (B, T)

    def for_layer(self, layer: int) -> Encoding:
        """Layer ``layer``'s view with its own draw (the authors' per-layer schemes, when drawn), else this."""
        if self.scheme not in ("layer", "distances") or not self._drawn():
            return self
        if self._forward is None:
            raise RuntimeError(f"{self.name}: for_layer before positions (the model asks positions first)")
        _, length, device = self._forward
        generator = self._generator(layer)
        if self.scheme == "layer":  # (1, T) sorted positions from [0, M)
            return LayerPositions(self, sorted_sample(1, length, draw_range(self, length), generator).to(device))
        # s_0 = 0, then T - 1 sorted distances from [1, M)
        drawn = sorted_sample(1, length - 1, draw_range(self, length), generator, low=1)[0]
        return LayerDistances(self, torch.cat((drawn.new_zeros(1), drawn)).to(device))

    def set_eval_length(self, length: int) -> None:
        self.base.set_eval_length(length)
        if self._random_eval() and length > self.max_position:
            raise PositionOutOfRange(f"{self.name} samples the positions of a window from [0, M), M = "
                                     f"{self.max_position}: no {length} distinct positions there")

    def set_train_length(self, length: int) -> None:
        self.base.set_train_length(length)

    def embed(self, x, pos):
        return self.base.embed(x, pos)

    def rotate(self, q, k, pos):
        return self.base.rotate(q, k, pos)

    def bias(self, q_pos, k_pos):
        return self.base.bias(q_pos, k_pos)

    def bias_factors(self, q_pos, k_pos):
        return self.base.bias_factors(q_pos, k_pos)

    def distance_bias(self, length: int):
        """The base's table over every distance of [0, M) (positions are drawn from there), or of the window."""
        return self.base.distance_bias(max(length, self.max_position))

    def attention_logits(self, q, k, q_pos, k_pos, mask, scale):
        return self.base.attention_logits(q, k, q_pos, k_pos, mask, scale)

    def attention_block(self, length: int) -> Optional[int]:
        return self.base.attention_block(length)

    def score_mod(self, q_pos, k_pos):
        return self.base.score_mod(q_pos, k_pos)  # (B, q), (B, k) positions: gathered per sequence


class LayerView(Encoding):
    """One attention layer's view of a ``+rand`` row under the authors' sampler (``Randomized.for_layer``): the
    wrapped encoding's hooks with that layer's draw; the model plans the layer's attention from the view's
    ``positions`` (``own_positions``)."""

    own_positions = True
    batched_positions = True

    def __init__(self, wrapper: Randomized) -> None:
        base = wrapper.base
        super().__init__(d_model=base.d_model, n_heads=base.n_heads, train_len=base.train_len)
        self.base, self.name, self.attention_sinks = base, wrapper.name, wrapper.attention_sinks


class LayerPositions(LayerView):
    """A layer's view at its drawn positions ``pos`` (1, T), whatever positions the model passes (its slots
    0 .. T-1): rotations and position-reading biases (FIRE) read them."""

    def __init__(self, wrapper: Randomized, pos: torch.Tensor) -> None:
        super().__init__(wrapper)
        self.pos = pos
        for flag in ("has_bias", "has_low_rank_bias", "has_distance_bias", "has_score_mod", "bias_kernel",
                     "has_attention_logits", "has_attention_parts", "has_attention_output"):
            setattr(self, flag, getattr(self.base, flag))

    def positions(self, batch: int, length: int, device: torch.device) -> torch.Tensor:
        return self.pos  # (1, T)

    def rotate(self, q, k, pos):
        return self.base.rotate(q, k, self.pos)

    def bias(self, q_pos, k_pos):
        return self.base.bias(q_pos, k_pos)  # the plan's chunks of self.pos

    def bias_factors(self, q_pos, k_pos):
        return self.base.bias_factors(q_pos, k_pos)

    def attention_logits(self, q, k, q_pos, k_pos, mask, scale):
        return self.base.attention_logits(q, k, q_pos, k_pos, mask, scale)

    def attention_block(self, length: int) -> Optional[int]:
        return self.base.attention_block(length)

    def score_mod(self, q_pos, k_pos):
        return self.base.score_mod(q_pos, k_pos)


class LayerDistances(LayerView):
    """A layer's view of a distance bias: the bias between slots i >= j is the base's bias at distance
    ``s[i - j]`` (``s`` (T,) sorted, s_0 = 0), a Toeplitz matrix like the authors'. Its table over the T slot
    distances, ``line`` (H, T), is the base's own bias at those distances, so the gradient reaches the base's
    parameters through it (KERPLE's), and it serves the distance-table path."""

    has_bias = True
    has_distance_bias = True
    has_score_mod = True

    def __init__(self, wrapper: Randomized, distances: torch.Tensor) -> None:
        super().__init__(wrapper)
        self.distances, self.bias_kernel = distances, self.base.bias_kernel
        self._line: Optional[torch.Tensor] = None

    def line(self) -> torch.Tensor:
        """(H, T): the base's bias at distance s_d for slot distance d = 0 .. T - 1."""
        if self._line is None:
            zero = self.distances.new_zeros(1)
            self._line = self.base.bias(self.distances, zero)[0, :, :, 0]  # (1, H, T, 1) -> (H, T)
        return self._line

    def positions(self, batch: int, length: int, device: torch.device) -> torch.Tensor:
        return torch.arange(length, device=device)

    def bias(self, q_pos, k_pos):
        line = self.line()
        return toeplitz_bias(lambda d: line[:, d], q_pos, k_pos)  # (1 or B, H, q, k)

    def distance_bias(self, length: int) -> torch.Tensor:
        return self.line()  # (H, T): W = T - 1, no distance of the window clamped

    def score_mod(self, q_pos, k_pos):
        line = self.line()
        last = line.shape[1] - 1
        return pair_score_mod(lambda h, i, j: line[h, (i - j).clamp(0, last)], q_pos, k_pos)


def _range_text(base: type[Encoding]) -> str:
    """M as the listing states it: the default rule, and whose ratio it is."""
    whose = "Ruoss et al.'s ratio" if base.randomized_range is None else f"{base.name}'s own randomized recipe"
    return f"{default_range_rule('authors', base.randomized_range)} ({whose})"


def randomized_row(base: type[Encoding]) -> type[Randomized]:
    """The ``<base>+rand`` class: the base's options plus ``max_position``, ``sampler``, ``eval_positions`` and
    ``eval_seed`` (its __init__ signature says so, which is what ``encodings.build`` checks options against)."""
    params = [p for n, p in inspect.signature(base.__init__).parameters.items() if n != "self"]
    own = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d)
           for n, d in (("max_position", 0), ("sampler", "authors"), ("eval_positions", ""), ("eval_seed", 0))]
    signature = inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
                                  + [p for p in params if p.name != "max_positions"] + own)

    def __init__(self, **kwargs) -> None:
        Randomized.__init__(self, **kwargs)

    __init__.__signature__ = signature
    name = f"{base.__name__}Rand"
    cls = type(name, (Randomized,), {
        "__init__": __init__, "__module__": __name__, "base_cls": base,
        "summary": f"{base.name} trained on sorted random positions from [0, M), M = {_range_text(base)}, "
                   f"as the authors' code draws them (claim: algorithmic tasks); Ruoss et al. 2023",
        "paper": f"Ruoss et al., ACL 2023 (arXiv:2305.16843), over {base.paper}",
        "has_bias": base.has_bias, "has_low_rank_bias": base.has_low_rank_bias, "has_distance_bias": base.has_distance_bias,
        "has_attention_logits": base.has_attention_logits, "positions_in_embedding": base.positions_in_embedding,
        "has_score_mod": base.has_score_mod,
    })
    globals()[name] = cls  # a module-level name: reprs and pickling find it
    return cls


def _wrappable() -> list[type[Encoding]]:
    """The trained encodings whose hooks take per-sequence positions, in the listing's order."""
    load_modules(before="randomized")
    names = [n for n, cls in REGISTRY.items()
             if cls.batched_positions and cls.trained_as is None and not issubclass(cls, Randomized)]
    return [REGISTRY[n] for n in listing_order(names)]


for _base in _wrappable():
    register(f"{_base.name}+rand")(randomized_row(_base))
