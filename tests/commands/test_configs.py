"""`posenc-bench configs`: every built-in config with its purpose and cost, each purpose true."""

from posenc_bench.commands.cli import main


def test_configs_lists_every_built_in_config_with_purpose_and_cost(capsys):
    from posenc_bench.bench.config import builtin_configs

    assert main(["configs"]) == 0
    out = capsys.readouterr().out
    for name in builtin_configs():
        assert f"\n{name} " in f"\n{out}"
    assert "Small sweep for tests and the CI regression gate" in out
    assert "cost: 6 trained model(s) x 400 steps of 32 x 128 tokens" in out and "its comment states ~10 min" in out


def test_each_configs_purpose_is_true_of_it_and_names_no_file_of_the_repository():
    """What `configs` prints is all a wheel user sees: no path they do not have, no "every encoding" for seven."""
    import re

    from posenc_bench import encodings
    from posenc_bench.bench.config import builtin_configs, config_header, load_config
    from posenc_bench.commands.configs import first_sentence

    for name, path in builtin_configs().items():
        header = config_header(path)
        assert not re.search(r"\b(configs|results|docs)/", first_sentence(header)), name
        if re.search(r"\bevery (registered )?encoding\b", header):
            assert set(load_config(name).encodings) >= set(encodings.available()), name
