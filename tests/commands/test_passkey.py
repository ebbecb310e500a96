"""`posenc-bench passkey`: its flags."""

from tests.commands.cli_helpers import subparser


def test_passkey_rope_scalings_are_the_hf_table():
    from posenc_bench.hf.rope import SCALINGS

    action = next(a for a in subparser("passkey")._actions if a.dest == "rope_scaling")
    assert tuple(action.choices) == tuple(SCALINGS)
