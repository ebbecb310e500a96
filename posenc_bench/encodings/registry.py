"""The encoding registry: every encoding's name, its class, and the questions callers ask of them.

Each family module of this package registers its encodings with ``@register("name")``; rows whose names follow
a pattern (``<encoding>+sink<S>+sw<W>``, ``sinks.py``) come from a ``@register_pattern`` function instead.
``available()`` lists the registered names in a fixed order, ``get_class`` and ``build`` resolve a name,
``trained`` and ``variants`` select rows by their declared hooks, and ``family`` reads the group a class
declares (never one guessed from its name or its module).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Callable, Iterable, Optional

from posenc_bench.encodings.base import FAMILIES, Encoding
from posenc_bench.errors import ConfigError, PositionOutOfRange, UnknownEncodingError
from posenc_bench.values import yaml_number

REGISTRY: dict[str, type[Encoding]] = {}

# The family modules; importing them fills REGISTRY, and the listing follows their order. Adding a family adds
# one name here.
MODULES = ("absolute", "rope", "partial_rope", "xpos", "fope", "hybrid", "rope_scaling", "rope_fixes", "string", "t5",
           "alibi", "kerple", "fire", "dape", "cope", "fox", "path", "stickbreaking", "nope",
           "randomized", "ssmax", "sinks")  # randomized and ssmax after the encodings they wrap; sinks: name patterns


def register(name: str) -> Callable[[type[Encoding]], type[Encoding]]:
    """Class decorator: make an Encoding subclass available under ``name``."""

    def decorate(cls: type[Encoding]) -> type[Encoding]:
        if name in REGISTRY:
            raise RuntimeError(f"encoding {name!r} is registered twice")
        cls.name = name
        REGISTRY[name] = cls
        return cls

    return decorate


# Row names made from a pattern rather than registered one by one (``<encoding>+sink<S>+sw<W>``): each
# function returns the class for a name it recognises (raising for a bad one) or None; classes are kept here.
_PATTERNS: list[Callable[[str], Optional[type[Encoding]]]] = []
_GENERATED: dict[str, type[Encoding]] = {}


def register_pattern(make: Callable[[str], Optional[type[Encoding]]]) -> Callable[[str], Optional[type[Encoding]]]:
    """Decorator: ``make(name)`` builds the class of every name of a pattern (see ``sinks.py``)."""
    _PATTERNS.append(make)
    return make


def load_modules(before: Optional[str] = None) -> None:
    """Import the family modules, or only those listed before module ``before`` (for a module that reads the
    registry as it loads: ``randomized`` wraps what the modules before it registered)."""
    for module in MODULES[:MODULES.index(before) if before is not None else len(MODULES)]:
        importlib.import_module(f"posenc_bench.encodings.{module}")


def listing_order(names: Iterable[str]) -> list[str]:
    """Registered ``names`` by family module in MODULES order (a plugin's after them), then in the order each
    module registers them: independent of which module happened to be imported first."""
    registered = list(REGISTRY)

    def rank(name: str) -> tuple[int, int]:
        module = REGISTRY[name].__module__.rsplit(".", 1)[-1]
        return (MODULES.index(module) if module in MODULES else len(MODULES), registered.index(name))

    return sorted(names, key=rank)


def available() -> list[str]:
    """Registered encoding names, in ``listing_order``."""
    load_modules()
    return listing_order(REGISTRY)


def trained() -> list[str]:
    """The registered encodings that train a model of their own (``trained_as`` is None), in ``available()``
    order: the rows a sweep trains, and the models every eval-only row evaluates."""
    return [n for n in available() if REGISTRY[n].trained_as is None]


def variants(trained_encoding: str, *, family: Optional[str] = None, finetuned: bool = False) -> list[str]:
    """The registered rows that evaluate the trained model ``trained_encoding`` zero-shot (``finetuned``: the
    rows that fine-tune it first), of ``family`` (one of FAMILIES) when given, in ``available()`` order (e.g.
    every zero-shot RoPE scaling: ``variants("rope", family="rotary scaling (zero-shot)")``)."""
    if family is not None and family not in FAMILIES:
        raise ConfigError(f"unknown encoding family {family!r}; valid families: {', '.join(map(repr, FAMILIES))}")
    return [n for n in available() if REGISTRY[n].trained_as == trained_encoding
            and REGISTRY[n].finetuned == finetuned and (family is None or REGISTRY[n].family == family)]


def get_class(name: str) -> type[Encoding]:
    load_modules()
    if name in REGISTRY:
        return REGISTRY[name]
    if name not in _GENERATED:
        for make in _PATTERNS:
            cls = make(name)
            if cls is not None:
                cls.name = name
                _GENERATED[name] = cls
                break
        else:
            raise UnknownEncodingError(f"unknown encoding {name!r}; valid encodings: {', '.join(available())}, "
                                       f"and <encoding>+sink<S>+sw<W> (attention sinks)")
    return _GENERATED[name]


def family(cls: type[Encoding]) -> str:
    """What kind of encoding ``cls`` is, for grouping (figure panels, the docs' table): the ``family`` the class
    declares (its own or its base's), one of FAMILIES; ConfigError when it declares none or another."""
    if cls.family not in FAMILIES:
        raise ConfigError(f"encoding class {cls.__name__} ({cls.name or 'not registered'}) declares family "
                          f"{cls.family!r}; set its class attribute family to one of: {', '.join(map(repr, FAMILIES))}")
    return cls.family


def build(name: str, *, d_model: int, n_heads: int, train_len: int, n_layers: int = 1,
          options: Optional[dict] = None) -> Encoding:
    """Instantiate encoding ``name``; ``options`` are the family's keyword options (e.g. t5 num_buckets).
    ``n_layers``: the model's attention layers, given to an encoding whose ``__init__`` takes it (one that keeps
    parameters per layer: CoPE's position tables); a shape, like d_model, never an option."""
    cls = get_class(name)
    options = dict(options or {})
    params = inspect.signature(cls.__init__).parameters
    valid = [p for p in params if p not in ("self", "d_model", "n_heads", "train_len", "n_layers")]
    bad = sorted(set(options) - set(valid))
    if bad:
        raise ConfigError(
            f"unknown option(s) {', '.join(map(repr, bad))} for encoding {name!r}; "
            f"valid options: {', '.join(valid) or '(none)'}"
        )
    for key, value in options.items():  # YAML 1.1 reads 1e6 as a string: the number type of the default
        try:
            options[key] = yaml_number(value, params[key].default)
        except ValueError:
            raise ConfigError(f"option {key!r} of encoding {name!r} must be a number, got {value!r}") from None
    shape = {"n_layers": n_layers} if "n_layers" in params else {}
    return cls(d_model=d_model, n_heads=n_heads, train_len=train_len, **shape, **options)


def out_of_range(name: str, train_len: int, length: int) -> str:
    """Why row ``name`` trained at ``train_len`` cannot evaluate windows of ``length`` tokens (its own
    ``set_eval_length`` refuses: a learned table past its rows, e.g. ``learned+ssmax``), "" where it can: what a
    sweep records as n/a. A position range does not depend on the width, so a small shape is built."""
    try:
        build(name, d_model=32, n_heads=4, train_len=train_len).set_eval_length(length)
    except PositionOutOfRange as e:
        return str(e)
    return ""
