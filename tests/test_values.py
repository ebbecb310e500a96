"""The values every layer shares: the precision names and the one YAML number rule."""

import pytest

from posenc_bench.values import PRECISIONS, TRAIN_PRECISIONS, yaml_number


def test_yaml_number_reads_strings_as_the_defaults_number_type():
    assert yaml_number("1e6", 10000.0) == 1e6 and isinstance(yaml_number("1e6", 10000.0), float)
    assert yaml_number("1e3", 32) == 1000 and isinstance(yaml_number("1e3", 32), int)
    assert yaml_number("12", 1.0) == 12.0
    with pytest.raises(ValueError, match="not a whole number"):
        yaml_number("1.5", 3)
    with pytest.raises(ValueError):
        yaml_number("lots", 1.0)


def test_yaml_number_leaves_everything_else_alone():
    assert yaml_number("true", True) == "true"  # a bool default is not a number
    assert yaml_number("rope", "alibi") == "rope"
    assert yaml_number(3, 1.0) == 3 and yaml_number(None, 1.0) is None
    assert yaml_number("2", None) == "2"


def test_precisions_need_no_torch_and_train_ones_are_a_subset():
    import subprocess
    import sys

    code = "import sys, posenc_bench.values; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    assert set(TRAIN_PRECISIONS) <= set(PRECISIONS) and PRECISIONS[0] == "fp32"
