"""The keys that decide reuse: each holds exactly what a model's weights or a row's numbers depend on."""

from pathlib import Path

import pytest

from posenc_bench.bench.config import config_from_dict, load_config
from posenc_bench.bench.keys import Keys, cell_key, eval_key, finetune_key, hf_eval_key, model_key, row_eval_options
from posenc_bench.bench.records import read_results
from posenc_bench.bench.rows import Row

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("folder", ["results/baseline-ci.json", "results/default", "results/sotu-512",
                                    "results/robustness/bpe-4096", "results/robustness/large",
                                    "results/robustness/bpe-4096-large"])
def test_the_keys_of_committed_results_are_what_the_code_computes(folder):
    """Keys are content hashes: a refactor that moved one would silently retrain every committed checkpoint
    (and refuse every resume)."""
    data = read_results(ROOT / folder)
    cfg, fingerprint = config_from_dict(data["run"]["config"]), data["run"]["corpus"]["fingerprint"]
    checked = 0
    for rec in data["records"]:
        row = Row.parse(rec["encoding"])
        if rec["versions"]["posenc_bench"] != __import__("posenc_bench").__version__:
            continue  # the package version is part of a key
        assert model_key(cfg, row, rec["seed"], fingerprint) == rec["cell_key"], rec["encoding"]
        assert eval_key(cfg, row) == rec["eval_key"], rec["encoding"]
        checked += 1
    assert checked >= 20


def test_options_key_only_the_encoding_they_belong_to():
    cfg = load_config("configs/ci.yaml")
    other = load_config("configs/ci.yaml", {"model.encoding_options": {"t5": {"num_buckets": 16}}})
    assert cell_key(cfg, Row("rope"), 0, "fp") == cell_key(other, Row("rope"), 0, "fp")
    assert cell_key(cfg, Row("t5"), 0, "fp") != cell_key(other, Row("t5"), 0, "fp")
    assert cell_key(cfg, Row("rope", 16), 0, "fp") != cell_key(cfg, Row("rope"), 0, "fp")
    assert cell_key(cfg, Row("rope"), 1, "fp") != cell_key(cfg, Row("rope"), 0, "fp")
    assert cell_key(cfg, Row("rope"), 0, "other text") != cell_key(cfg, Row("rope"), 0, "fp")


def test_a_variants_options_change_only_its_own_eval_key():
    cfg = load_config("configs/ci.yaml")
    fixed = load_config("configs/ci.yaml", {"model.encoding_options": {"rope-ntk": {"factor": 2.0}}})
    assert eval_key(cfg, Row("rope")) == eval_key(fixed, Row("rope")) == eval_key(cfg)
    assert eval_key(cfg, Row("rope-ntk")) != eval_key(fixed, Row("rope-ntk"))
    assert eval_key(cfg) == eval_key(load_config("configs/ci.yaml", {"eval.batch_tokens": 512}))  # how, not what
    assert eval_key(cfg) != eval_key(load_config("configs/ci.yaml", {"eval.tokens": 512}))


def test_the_model_a_row_evaluates_has_the_key_of_its_checkpoint():
    cfg = load_config("configs/ci.yaml", {"encodings": ["rope", "rope-yarn", "rope-linear-ft", "rope-ft"]})
    trained = cell_key(cfg, Row("rope"), 0, "fp")
    assert model_key(cfg, Row("rope-yarn"), 0, "fp") == trained  # zero-shot: rope's checkpoint
    ft = model_key(cfg, Row("rope-linear-ft"), 0, "fp")
    assert ft == finetune_key(trained, cfg, Row("rope-linear-ft")) != trained
    assert model_key(cfg, Row("rope-ft"), 0, "fp") not in (ft, trained)  # each -ft row is its own model
    longer = load_config("configs/ci.yaml", {"encodings": ["rope-linear-ft"], "finetune.steps": 3})
    assert model_key(longer, Row("rope-linear-ft"), 0, "fp") != ft


def test_keys_of_a_run_are_computed_once(monkeypatch):
    import posenc_bench.bench.keys as keys

    cfg = load_config("configs/ci.yaml")
    calls = []
    real = keys.model_key
    monkeypatch.setattr(keys, "model_key", lambda *a: calls.append(a) or real(*a))
    k = Keys(cfg, "fp")
    first = k.cell(Row("rope"), 0)
    assert k.cell(Row("rope"), 0) == first and k.model(Row("rope"), 0) == first["cell_key"] and len(calls) == 1
    assert first == {"cell_key": cell_key(cfg, Row("rope"), 0, "fp"), "eval_key": eval_key(cfg, Row("rope"))}


def test_a_hugging_face_eval_key_holds_the_weights_the_text_and_the_scoring():
    base = dict(model={"ref": "m", "file_sha256": "a"}, train_len=64, lengths=[64, 128], corpus="c",
                eval_fingerprint="e", doc_sep=1, buckets=64, unit=128)
    key = hf_eval_key(**base)
    assert key == hf_eval_key(**base) and len(key) == 16
    for field, value in [("model", {"ref": "m", "file_sha256": "b"}), ("unit", 64), ("doc_sep", None),
                         ("eval_fingerprint", "f"), ("lengths", [64, 256])]:
        assert hf_eval_key(**{**base, field: value}) != key, field


def test_document_bounded_windows_change_the_eval_key_and_the_stream_keeps_the_old_one():
    cfg = load_config("configs/ci.yaml")
    assert eval_key(cfg) == eval_key(load_config("configs/ci.yaml", {"eval.windows": "stream"}))
    assert eval_key(cfg) != eval_key(load_config("configs/ci.yaml", {"eval.windows": "documents"}))


def test_rand_eval_positions_enter_the_eval_key_and_never_the_weights_key():
    cfg = load_config("configs/ci.yaml", {"encodings": ["rope", "rope+rand"]})
    ordered = load_config("configs/ci.yaml", {"encodings": ["rope", "rope+rand"], "model.encoding_options": {
        "rope+rand": {"eval_positions": "ordered"}}})
    seeded = load_config("configs/ci.yaml", {"encodings": ["rope", "rope+rand"], "model.encoding_options": {
        "rope+rand": {"eval_seed": 1}}})
    rand = Row("rope+rand")
    assert cell_key(cfg, rand, 0, "fp") == cell_key(ordered, rand, 0, "fp") == cell_key(seeded, rand, 0, "fp")
    assert len({eval_key(cfg, rand), eval_key(ordered, rand), eval_key(seeded, rand)}) == 3
    assert eval_key(ordered, rand) == eval_key(cfg)  # at 0 .. L-1: the key +rand rows were evaluated with before
    assert eval_key(cfg, Row("rope")) == eval_key(seeded, Row("rope")) == eval_key(cfg)  # other rows: as they were
    assert eval_key(cfg, Row("rope+rand+sink2+sw8")) == eval_key(cfg)  # sinks: the cache's positions, 0 .. L-1
    assert row_eval_options({}, rand) == {"eval_positions": "random", "eval_seed": 0}
    assert row_eval_options({"rope": {"theta": 1.0}}, Row("rope")) == {}
