"""The gate section (bench/config/gate.py): tolerances, and per-row overrides of them, checked up front."""

import pytest

from posenc_bench.bench.config import GATE_TOLERANCE_KEYS, GateConfig, load_config, validate_gate
from posenc_bench.errors import ConfigError, UnknownEncodingError


def test_the_ci_configs_tolerances_are_the_defaults_and_each_is_a_key():
    assert load_config("ci").gate == GateConfig()
    assert set(GATE_TOLERANCE_KEYS) <= set(vars(GateConfig()))


@pytest.mark.parametrize("gate,match", [
    (GateConfig(ppl_tol=-0.1), "gate.ppl_tol must be a number >= 0"),
    (GateConfig(sigmas=True), "gate.sigmas must be a number >= 0"),
    (GateConfig(per_encoding={"rope": {"slack": 1}}), "unknown config key gate.per_encoding.rope.slack"),
    (GateConfig(per_encoding={"rope": 0.1}), r"gate.per_encoding.rope must be a mapping like \{ratio_tol: 0.05\}"),
    (GateConfig(per_encoding={"alibi": {"ratio_tol": float("nan")}}), "gate.per_encoding.alibi.ratio_tol must be a number"),
    (GateConfig(per_encoding=[]), "gate.per_encoding must map encoding rows to tolerances"),
])
def test_bad_tolerances_are_refused(gate, match):
    with pytest.raises(ConfigError, match=match):
        validate_gate(gate)


def test_a_per_row_tolerance_names_a_known_row():
    validate_gate(GateConfig(per_encoding={"rope+sw64": {"ratio_tol": 0.05}}))
    with pytest.raises(UnknownEncodingError):
        validate_gate(GateConfig(per_encoding={"ropy": {"ratio_tol": 0.05}}))
