"""Randomized positional encodings: ``<encoding>+rand``.

Ruoss, Deletang, Genewein, Grau-Moya, Csordas, Bennani, Legg & Veness, "Randomized Positional Encodings Boost
Length Generalization of Transformers", ACL 2023 (arXiv:2305.16843): in training, each sequence's positions
are a sorted sample without replacement from [0, M), M larger than any test length, so the model meets every
position (and distance) up to M while training on short sequences. The authors randomize at test time too
("Yes, we also randomize at test time", google-deepmind/randomized_positional_encodings issue 1), so by
default (option ``eval_positions: random``) each evaluated window also gets a sorted sample from [0, M), drawn
from a generator seeded by the row (its name), the window (the run-wide index the evaluation gives it,
``set_eval_windows``), the window's length and the option ``eval_seed`` (default 0): every run, every seed of
the row and every batch size scores the same positions. ``eval_positions: ordered`` evaluates at 0 .. L-1 (what
this benchmark did before). Both are eval-time options: not in the cell key of the weights, in the eval key and
the records (``eval_options``) where they change the numbers. A row with attention sinks evaluates at 0 .. L-1
(its positions are those of the cache), and L must not exceed M (n/a past it).
The paper's claim is about algorithmic tasks (its length-generalization benchmark); a perplexity row tests
whether it carries over to language modelling, a different claim.

M (option ``max_position``) defaults to ``MULTIPLE`` x the train length, a fixed multiple so that training
never depends on the eval config: 8 x covers the 4x eval lengths of our configs twice over (the paper, too,
samples from a range well beyond its longest test length), while keeping the mean gap between sampled
positions at 8, so the training positions stay dense enough for every one of them to be seen. The resolved
M is part of the cell key (``key_options``).

One loop registers ``<name>+rand`` for every trained encoding registered before this module (``registry.MODULES``
lists it after them) whose hooks take per-sequence positions (``batched_positions``), so a new such encoding gets its
row without a list kept here. The wrapped encoding is built with the same options and random stream as the
plain one (identical initial parameters); an encoding with a ``max_positions`` option (``learned``) gets M, so
``learned+rand``'s table has M rows and is ``n/a`` past them. The sample of each training forward comes from
a generator seeded by the encoding's seed and a step counter saved with the weights, so a resumed run draws
the positions an uninterrupted one draws.
"""

from __future__ import annotations

import hashlib
import inspect
from typing import ClassVar, Optional

import torch

from posenc_bench.encodings.base import Encoding
from posenc_bench.encodings.registry import REGISTRY, listing_order, load_modules, register
from posenc_bench.errors import PositionOutOfRange

MULTIPLE = 8
EVAL_POSITIONS = ("random", "ordered")  # the authors' sorted samples at test time, or 0 .. L-1


def resolve_range(train_len: int, max_position: int) -> int:
    """M: max_position, or MULTIPLE x the train length when it is 0."""
    if max_position < 0 or (max_position and max_position < train_len):
        raise ValueError(f"max_position must be 0 ({MULTIPLE} x the train length) or >= the train length "
                         f"{train_len}, got {max_position}")
    return max_position or MULTIPLE * train_len


def sorted_sample(batch: int, length: int, high: int, generator: torch.Generator) -> torch.Tensor:
    """(batch, length) int64: each row a sorted sample without replacement from [0, high)."""
    keys = torch.rand(batch, high, generator=generator)
    return keys.topk(length, dim=-1).indices.sort(dim=-1).values


class Randomized(Encoding):
    """The wrapper: ``base`` holds the wrapped encoding; every hook is the base's, with the positions above."""

    base_cls: ClassVar[type[Encoding]]
    family = "randomized positions"
    # options that choose only how the trained model is evaluated: never in the cell key (``bench.keys``)
    eval_option_names: ClassVar[tuple[str, ...]] = ("eval_positions", "eval_seed")

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, max_position: int = 0,
                 eval_positions: str = "random", eval_seed: int = 0, **options) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len)
        self.max_position = resolve_range(train_len, max_position)
        if eval_positions not in EVAL_POSITIONS:
            raise ValueError(f"eval_positions must be one of {', '.join(EVAL_POSITIONS)}, got {eval_positions!r}")
        self.eval_positions, self.eval_seed = eval_positions, int(eval_seed)
        if "max_positions" in inspect.signature(self.base_cls.__init__).parameters:
            options["max_positions"] = self.max_position
        self.base = self.base_cls(d_model=d_model, n_heads=n_heads, train_len=train_len, **options)
        self._seed = int(torch.randint(0, 2**62, ()))  # drawn after the base: its parameters are the plain ones
        self.register_buffer("draws", torch.zeros(1, dtype=torch.int64))
        self._windows: Optional[torch.Tensor] = None

    @classmethod
    def key_options(cls, train_len: int, options: dict) -> dict:
        return {**cls.base_cls.key_options(train_len, options),
                "max_position": resolve_range(train_len, int(options.get("max_position", 0)))}

    @classmethod
    def eval_options(cls, options: dict) -> dict:
        """The eval-time options that make this row's numbers, resolved: {} where it evaluates at 0 .. L-1 (the
        numbers of before, ``ordered``, or a row with attention sinks)."""
        order = options.get("eval_positions", "random")
        if order == "ordered" or cls.attention_sinks is not None:
            return {}
        return {"eval_positions": order, "eval_seed": int(options.get("eval_seed", 0))}

    def _random_eval(self) -> bool:
        return self.eval_positions == "random" and self.attention_sinks is None

    def set_eval_windows(self, windows: Optional[torch.Tensor]) -> None:
        self._windows = None if windows is None else windows.detach().to("cpu", torch.int64)

    def eval_generator(self, window: int, length: int) -> torch.Generator:
        """The generator of one evaluated window's positions: seeded by the row (its name), the window, its
        length and ``eval_seed``, through a hash (no two of them share a stream by arithmetic accident). Nothing
        of the model's seed: a checkpoint loaded anywhere scores the positions it scored, and the seeds of a row
        are scored on the same positions."""
        ident = f"{self.name}|{self.eval_seed}|{window}|{length}".encode()
        return torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(ident).digest()[:8], "big") >> 1)

    def positions(self, batch: int, length: int, device: torch.device) -> torch.Tensor:
        if not self.training:
            if not self._random_eval():
                return torch.arange(length, device=device)
            # windows the evaluation did not name (a direct forward, passkey): numbered 0 .. B-1 in the batch
            windows = self._windows if self._windows is not None else torch.arange(batch)
            if windows.numel() != batch:
                raise ValueError(f"set_eval_windows gave {windows.numel()} windows for a batch of {batch}")
            rows = [sorted_sample(1, length, self.max_position, self.eval_generator(int(w), length)) for w in windows]
            return torch.cat(rows).to(device)  # (B, T)
        generator = torch.Generator().manual_seed(self._seed + int(self.draws))
        with torch.no_grad():
            self.draws += 1
        return sorted_sample(batch, length, self.max_position, generator).to(device)  # (B, T)

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


def randomized_row(base: type[Encoding]) -> type[Randomized]:
    """The ``<base>+rand`` class: the base's options plus ``max_position``, ``eval_positions`` and ``eval_seed``
    (its __init__ signature says so, which is what ``encodings.build`` checks options against)."""
    params = [p for n, p in inspect.signature(base.__init__).parameters.items() if n != "self"]
    own = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d)
           for n, d in (("max_position", 0), ("eval_positions", "random"), ("eval_seed", 0))]
    signature = inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
                                  + [p for p in params if p.name != "max_positions"] + own)

    def __init__(self, **kwargs) -> None:
        Randomized.__init__(self, **kwargs)

    __init__.__signature__ = signature
    name = f"{base.__name__}Rand"
    cls = type(name, (Randomized,), {
        "__init__": __init__, "__module__": __name__, "base_cls": base,
        "summary": f"{base.name} trained and evaluated on sorted random positions from [0, M), M = {MULTIPLE} x "
                   f"train length (claim: algorithmic tasks); Ruoss et al. 2023",
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
