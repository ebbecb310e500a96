"""The ``gate`` section: what `posenc-bench gate` counts as a regression (``analysis/gate.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from posenc_bench.bench.rows import Row
from posenc_bench.errors import ConfigError

GATE_TOLERANCE_KEYS = ("ppl_tol", "ratio_tol", "sigmas", "acc_tol")


@dataclass
class GateConfig:
    """What `posenc-bench gate` counts as a regression (see analysis/gate.py)."""

    ppl_tol: float = 0.02  # allowed relative rise of mean ppl at any length
    ratio_tol: float = 0.02  # allowed relative rise of the extrapolation ratio ppl(kx) / ppl(1x)
    sigmas: float = 3.0  # with >= 2 baseline seeds, allow this many standard errors of the seed spread
    acc_tol: float = 0.05  # a task run: allowed drop of mean exact match (0.05 = 5 points) at any size
    per_encoding: dict = field(default_factory=dict)  # row -> {ppl_tol, ratio_tol, sigmas} overrides


def validate_gate(g: GateConfig) -> None:
    def check(values: dict, where: str) -> None:
        for key, value in values.items():
            if key not in GATE_TOLERANCE_KEYS:
                raise ConfigError(f"unknown config key {where}.{key}; valid keys: {', '.join(GATE_TOLERANCE_KEYS)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0 and math.isfinite(value)):
                raise ConfigError(f"{where}.{key} must be a number >= 0, got {value!r}")

    check({k: getattr(g, k) for k in GATE_TOLERANCE_KEYS}, "gate")
    if not isinstance(g.per_encoding, dict):
        raise ConfigError(f"gate.per_encoding must map encoding rows to tolerances, got {g.per_encoding!r}")
    for row, values in g.per_encoding.items():
        Row.parse(str(row))  # an unknown encoding fails here, listing the valid ones
        if not isinstance(values, dict):
            raise ConfigError(f"gate.per_encoding.{row} must be a mapping like {{ratio_tol: 0.05}}, got {values!r}")
        check(values, f"gate.per_encoding.{row}")
