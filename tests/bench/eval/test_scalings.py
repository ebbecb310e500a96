"""bench/eval/scalings.py: the zero-shot rows `eval --rope-scaling` and `needles` take by name."""

import pytest

from posenc_bench.bench.eval.scalings import checkpoint_scalings, parse_scalings, require_hf
from posenc_bench.errors import ConfigError
from posenc_bench.hf import rope as hf_rope


def test_every_fix_row_is_accepted_for_hugging_face_models_but_a_bare_sink():
    rows = parse_scalings("all,ntk,rerope,leaky,selfextend,sink4+sw60")
    require_hf(rows)
    with pytest.raises(ConfigError, match="trained without a sliding window"):
        require_hf(["sink4"])


def test_rope_scaling_names_are_the_suffixes_of_the_rope_rows():
    """The names ``--rope-scaling`` takes are the rope model's zero-shot rows by suffix (``Row.suffix``)."""
    assert checkpoint_scalings() == ["linear", "ntk", "dynamic", "yarn", "llama3", "rerope", "leaky", "selfextend",
                                     "string"]
    assert parse_scalings("yarn,sink4+sw60,sink4,none,yarn") == ["yarn", "sink4+sw60", "sink4"]
    assert parse_scalings("") == [] and parse_scalings("all") == list(hf_rope.SCALINGS)
    for bad in ("linear-ft", "rand", "sink4+sw0", "bca"):  # fine-tuned, trained, a bad sink window, xpos's fix
        with pytest.raises(ConfigError, match="is not a scaling; valid: linear, dynamic, yarn, llama3, ntk"):
            parse_scalings(bad)
