"""The metrics of a results file, one module each, and their registry (``registry.py``): what every table,
finding, plot and gate check asks about a number. ``from posenc_bench import metrics`` gives the registry's
functions; adding a metric is one module (registered in ``registry.MODULES``, or a plugin's through the
entry-point group ``posenc_bench.metrics``) and its test."""

from posenc_bench.metrics.registry import (ENTRY_POINTS, MIN_EFFECT, MIN_POINTS, MODULES, SHARE, Kind, Metric,
                                           MetricError, get, kind, kind_of, kinds, names, of_kind, record_value,
                                           register, register_kind, tabled, unregister)

__all__ = ["ENTRY_POINTS", "MIN_EFFECT", "MIN_POINTS", "MODULES", "SHARE", "Kind", "Metric", "MetricError", "get",
           "kind", "kind_of", "kinds", "names", "of_kind", "record_value", "register", "register_kind", "tabled",
           "unregister"]
