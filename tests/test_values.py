"""The values every layer shares: the precision names, the one YAML number rule and the eval lengths."""

import pytest

from posenc_bench.errors import ConfigError
from posenc_bench.values import PRECISIONS, TRAIN_PRECISIONS, parse_eval_lens, yaml_number


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


@pytest.mark.parametrize("spec,expected", [
    ("1,1.5,2,4x", [128, 192, 256, 512]),
    ("4096", [128, 4096]),
    ("2x", [128, 256]),
    ("2x,300", [128, 256, 300]),
    (["1x", "1.5x", "2x", "4x"], [128, 192, 256, 512]),
    ("0.5x,4096", [64, 128, 4096]),
])
def test_eval_lens(spec, expected):
    assert parse_eval_lens(spec, 128) == expected


@pytest.mark.parametrize("bad,match", [("0", "at least 1"), ("-2x", "at least 1"), ("abc", "not a number"),
                                       ("1.5", "whole number"), ("0.001x", "at least 1"),
                                       ("300,2x", "put the multiples first"),
                                       ("1,2,4", r"eval length 1 reads as 1 token, below the train length 128: did you "
                                                 r"mean multiples of it \(1,2,4x\)\? .* \(e\.g\. 0\.0078125x\)"),
                                       ("64", r"below the train length 128.*e\.g\. 0\.5x")])
def test_bad_eval_lens(bad, match):
    with pytest.raises(ConfigError, match=match):
        parse_eval_lens(bad, 128)
