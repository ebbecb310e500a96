"""Positional encodings: the base class (``base.py``), the registry (``registry.py``) and one module per family.

Every family module registers each of its encodings with ``@register("name")``; ``get_class`` and ``build``
resolve a name, ``available`` lists them all. The model only ever calls the hooks of :class:`Encoding` and
reads its capability flags; it never looks at an encoding's name.
"""

from posenc_bench.encodings.base import FAMILIES, INIT_STD, Encoding, consecutive_start
from posenc_bench.encodings.registry import (REGISTRY, available, build, family, get_class, out_of_range, register,
                                             register_pattern, trained, variants)

__all__ = ["FAMILIES", "INIT_STD", "REGISTRY", "Encoding", "available", "build", "consecutive_start", "family",
           "get_class", "out_of_range", "register", "register_pattern", "trained", "variants"]
