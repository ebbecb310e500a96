"""A row of a sweep (and of its tables): what it evaluates, parsed once from its name.

A row name is a registered encoding (``rope``, ``rope-yarn``, ``rope+rand``: names may hold a ``+``), with
the sliding window its model was trained with as a trailing ``+sw<W>`` (Beltagy et al. 2020): ``rope+sw64``.
Attention sinks (``encodings/sinks.py``, whose grammar this module asks) make two more forms: ``rope+sink4+sw64``
is the encoding of that name, a zero-shot cache of 64 keys plus 4 sinks on the rope model trained without a
window; ``rope+sw64+sink4`` is the encoding ``rope+sink4`` on the model trained with a window of 64.

:class:`Row` is the one place that reads a name. It knows the registered encoding it builds, the window, the
sinks, the trained model it reads (``rope-linear+sw64`` reads ``rope+sw64``'s checkpoint), whether it
fine-tunes that model first (``-ft`` rows own a checkpoint of their own) or only evaluates it, and the suffix
that names it on that model (``eval --rope-scaling``). Every other module asks a Row; none parses a name
again (``tests/bench/test_rows.py`` reads the package to keep it so).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

from posenc_bench import encodings
from posenc_bench.encodings import sinks as sink_rows
from posenc_bench.errors import ConfigError, UnknownEncodingError

GRAMMAR = ("expected <encoding>, <encoding>+sw<W>, <encoding>+sink<S>+sw<W> or <encoding>+sw<W>+sink<S>, "
           "e.g. rope+sw64")


@dataclass(frozen=True)
class Row:
    """A row: the registered encoding it evaluates with and the window its model was trained with."""

    encoding: str
    window: Optional[int] = None

    @staticmethod
    def parse(spec: str) -> "Row":
        """The row named ``spec``; ConfigError (UnknownEncodingError for an unknown encoding, listing the valid
        ones) when it is not a row."""
        return _parse(str(spec))

    @property
    def name(self) -> str:
        """The row's name, the inverse of ``parse``: the trained window comes before sinks added at evaluation."""
        if self.window is None:
            return self.encoding
        sinks = sink_rows.parse(self.encoding)
        if sinks is not None and sinks[2] is None:  # rope+sink4 on the rope+sw64 model: rope+sw64+sink4
            base, count, _ = sinks
            return f"{base}+sw{self.window}+sink{count}"
        return f"{self.encoding}+sw{self.window}"

    def __str__(self) -> str:
        return self.name

    @property
    def cls(self) -> type[encodings.Encoding]:
        return encodings.get_class(self.encoding)

    @property
    def finetuned(self) -> bool:
        """A ``-ft`` row: its trained model is trained further at the fine-tune length (its own checkpoint)."""
        return self.cls.finetuned

    @property
    def eval_only(self) -> bool:
        """A row that evaluates another row's trained model as it is (a zero-shot scaling, fix or sinks)."""
        return self.cls.trained_as is not None and not self.cls.finetuned

    @property
    def trained(self) -> "Row":
        """The row whose training makes the weights this row starts from (itself for a trained encoding)."""
        return Row(self.cls.trained_as or self.encoding, self.window)

    @property
    def model(self) -> "Row":
        """The row whose checkpoint holds the weights this row evaluates: its trained row for an eval-only row,
        itself otherwise (a -ft row's fine-tuned checkpoint is its own)."""
        return self.trained if self.eval_only else self

    @property
    def sinks(self) -> Optional[tuple[int, Optional[int]]]:
        """(S sinks, their window or None for the trained window) of an attention-sink row, else None."""
        return self.cls.attention_sinks

    @property
    def suffix(self) -> str:
        """What this row adds to the name of its trained row's encoding (the inverse of ``variant``): yarn for
        rope-yarn, sink4+sw124 for rope+sink4+sw124, linear-ft for rope-linear-ft; "" for a trained row."""
        base = self.cls.trained_as
        if base is None:
            return ""
        head, rest = self.encoding[: len(base) + 1], self.encoding[len(base) + 1 :]
        return rest if head in (f"{base}-", f"{base}+") else self.encoding

    def with_sinks(self, count: int, window: Optional[int] = None) -> "Row":
        """The attention-sink row of this trained row: ``count`` sinks in a cache of ``window`` keys (None: the
        window the model was trained with), e.g. Row("rope").with_sinks(4, 124) is rope+sink4+sw124."""
        return self.variant(f"sink{count}" + (f"+sw{window}" if window is not None else ""))

    def variant(self, suffix: str) -> "Row":
        """The zero-shot row ``suffix`` of this trained row: yarn -> rope-yarn, rerope -> rope-rerope,
        sink4+sw124 -> rope+sink4+sw124 (same window). ConfigError when no registered encoding of that name
        evaluates this row's trained model."""
        row = Row(variant_name(self.encoding, suffix), self.window)
        try:
            known = row.trained == self and row.eval_only
        except ConfigError:  # no encoding of that name
            known = False
        if not known:
            valid = encodings.variants(self.encoding)
            raise ConfigError(f"no registered encoding {row.encoding!r} evaluates the trained {self.encoding!r} model; its "
                              f"zero-shot rows: {', '.join(valid) or '(none)'}, and {self.encoding}+sink<S>+sw<W>")
        return row

    def grid(self, train_len: int, window: int, options: dict) -> list[dict]:
        """The tuning grid of this zero-shot row at windows of ``window`` tokens of a model trained at ``train_len``
        (its class's ``tuning_grid``, the authors' values first), with its configured ``options`` held (dropped
        from every point, equal points merged); [] with fewer than two points left: nothing to choose. One rule
        for our models, a pretrained one and the captions that say whether a row was tuned."""
        points = self.cls.tuning_grid(train_len, window, options)
        held = dict.fromkeys(tuple((k, v) for k, v in p.items() if k not in options) for p in points)
        out = [dict(p) for p in held if p]
        return out if len(out) > 1 else []


def rope_row(scaling: str) -> Optional[Row]:
    """The zero-shot row of the trained rope model that ``scaling`` names (yarn, sink4+sw124, sink4), or None."""
    try:
        return Row("rope").variant(scaling)
    except ConfigError:
        return None


def variant_name(encoding: str, suffix: str) -> str:
    """The name of the zero-shot row ``suffix`` of the trained ``encoding``: rope-yarn, rope+sink4+sw124."""
    return f"{encoding}+{suffix}" if sink_rows.parse(f"{encoding}+{suffix}") is not None else f"{encoding}-{suffix}"


@functools.lru_cache(maxsize=None)
def _parse(spec: str) -> Row:
    sinks = sink_rows.parse(spec)
    if sinks is not None and sinks[2] is None:  # <base>+sink<S>: sinks on the base row's trained window
        base, count, _ = sinks
        trained = _parse(base)
        return _checked(spec, Row(f"{trained.encoding}+sink{count}", trained.window))
    head, sep, rest = spec.rpartition("+")
    if sinks is None and sep and rest.startswith("sw"):  # <encoding>+sw<W>
        if not rest[2:].isdigit() or int(rest[2:]) < 1:
            raise ConfigError(f"bad encoding row {spec!r}: {GRAMMAR}")
        return _checked(spec, Row(head, int(rest[2:])))
    return _checked(spec, Row(spec))


def _checked(spec: str, row: Row) -> Row:
    """``row`` if its encoding is registered (or a name pattern builds it); else the error naming the valid ones."""
    try:
        encodings.get_class(row.encoding)
    except UnknownEncodingError:
        head, sep, _ = spec.rpartition("+")
        if sep and row.window is None and head in encodings.available():  # a known encoding, an unknown suffix
            raise ConfigError(f"bad encoding row {spec!r}: {GRAMMAR}") from None
        raise
    return row


def select_rows(value: str, base: list[str], every: Optional[list[str]] = None) -> list[str]:
    """The selection syntax of ``run --encodings`` and ``plot --rows``: 'rope,alibi' replaces ``base``;
    '-learned' removes a row and its windowed rows (learned+sw64: a window is not another encoding), never
    another row whose name starts the same way ('-rope' keeps rope+rand, rope-yarn and rope+sw64+sink4);
    'all' is ``every``. Without ``every``: rows of registered encodings ('all' = every registered one,
    'rope+sw64' allowed); with it, only rows in ``every`` (e.g. a results file's rows, which may be a
    pretrained model's), and a name outside it is a ConfigError listing them."""
    items = [v.strip() for v in value.split(",") if v.strip()]
    plus = [i for i in items if not i.startswith("-")]
    minus = {i[1:] for i in items if i.startswith("-")}
    chosen: list[str] = []
    for item in plus or base:
        chosen.extend((encodings.available() if every is None else every) if item == "all" else [item])
    for item in list(chosen) + sorted(minus):
        if every is None:
            Row.parse(item)  # unknown names fail here, listing the valid ones
        elif item not in every and not any(_unwindowed(r) == item for r in every):
            raise ConfigError(f"row {item!r} is not in the results; rows: {', '.join(every)}")
    return [c for c in dict.fromkeys(chosen) if c not in minus and _unwindowed(c) not in minus]


def _unwindowed(name: str) -> str:
    """The row ``name`` without the window its model was trained with (rope+sw64 -> rope; rope+rand stays);
    a results file's row that is no row of ours (a Hugging Face model's, ``hf:smollm2+yarn``) is itself."""
    try:
        return Row.parse(name).encoding
    except ConfigError:
        return name
