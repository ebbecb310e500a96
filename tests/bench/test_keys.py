"""The keys that decide reuse: each holds exactly what a model's weights or a row's numbers depend on."""

from pathlib import Path

import pytest

from posenc_bench.bench.config import config_from_dict, load_config
from posenc_bench.bench.keys import Keys, cell_key, eval_key, finetune_key, hf_eval_key, model_key, row_eval_options
from posenc_bench.bench.records import read_results
from posenc_bench.bench.rows import Row

ROOT = Path(__file__).resolve().parents[2]


def committed_results():
    """Every committed results file with records of our models: each folder's results.json (found, so a new
    folder is checked too) and the CI gates' baselines."""
    found = sorted(str(p.parent.relative_to(ROOT)) for p in (ROOT / "results").rglob("results.json"))
    return found + ["results/baseline-ci.json", "results/baseline-tasks-ci.json"]


# Records whose keys were made before their rows' key rules changed, by folder: such a folder keeps them as they
# were measured until it is rerun whole at one commit, and every other record of it is checked. None now: the
# last, sotu-512-full's fire+rand (trained at Ruoss et al.'s M before it took mcleish7's), was rerun at 58b3948.
STALE: dict[str, set[str]] = {}


@pytest.mark.parametrize("folder", committed_results())
def test_every_committed_key_is_what_the_code_computes_whatever_the_release(folder, monkeypatch):
    """Keys are content hashes: a refactor that moved one would silently retrain every committed checkpoint
    (and refuse every resume); so would a release, were the release version in a key (it is not: NUMERICS is).

    Checked, under a release version of 9.9.9: every record with a ``cell_key`` in results/default, full,
    sotu-512 (and its step-probe folders), sotu-512-full, robustness/*, tasks/*, timing-gpu/long-2048-200 and
    the baselines baseline-ci.json and baseline-tasks-ci.json, rebuilt from the run's config (as ``gate`` and
    a resume do). Skipped: Hugging Face evals (results/smollm2, timing-gpu/smollm2: no cell key, an
    ``hf_eval_key``) and the rows of ``STALE``."""
    monkeypatch.setattr("posenc_bench.__version__", "9.9.9")
    data = read_results(ROOT / folder)
    if not any(rec.get("cell_key") for rec in data["records"]):
        pytest.skip(f"{folder}: a pretrained model's eval, no cell keys")
    cfg, fingerprint = config_from_dict(data["run"]["config"]), data["run"]["corpus"]["fingerprint"]
    checked = 0
    for rec in data["records"]:
        if not rec.get("cell_key") or rec["encoding"] in STALE.get(folder, ()):
            continue
        row = Row.parse(rec["encoding"])
        assert model_key(cfg, row, rec["seed"], fingerprint) == rec["cell_key"], rec["encoding"]
        assert eval_key(cfg, row) == rec["eval_key"], rec["encoding"]
        checked += 1
    assert checked >= min(20, len(data["records"]))


@pytest.mark.parametrize("folder", committed_results())
def test_every_committed_text_record_names_the_document_of_each_unit(folder):
    """``units["doc"]`` (given to the folders made before it by ``posenc-bench documents``): one per unit, a place
    in the run's ``eval_documents``, and the units of each document hold its targets as the run lists them
    (``from_run_metadata``: documents in scoring order). Task records need none: each unit is one instance. The
    field joins no key and no identity: the test above checks every key of these same records."""
    from posenc_bench.bench.eval.documents import from_run_metadata, text_records
    from posenc_bench.bench.eval.evaluate import unit_documents

    data = read_results(ROOT / folder)
    texts = text_records(data)
    if not texts:
        pytest.skip(f"{folder}: a task's records (each unit one test instance)")
    documents = data["run"]["eval_documents"]
    expected = from_run_metadata(data["run"])
    for rec in texts:
        units = rec["units"]
        assert len(units["doc"]) == len(units["nll"]) and set(units["doc"]) <= set(range(len(documents))), rec["encoding"]
        assert units["doc"] == unit_documents(expected.target_docs, units["size"]), rec["encoding"]


def test_the_headline_run_s_units_fill_its_speeches_in_order():
    """results/sotu-512 (document-bounded windows): 102 units of 2048 targets over its 11 speeches, in order,
    each speech's units holding exactly the targets the run scored of it."""
    data = read_results(ROOT / "results/sotu-512")
    documents = list(data["run"]["eval_documents"].values())
    for rec in (r for r in data["records"] if r.get("units")):
        doc = rec["units"]["doc"]
        assert len(doc) == 102 and rec["units"]["size"] == 2048 and doc == sorted(doc)
        assert [2048 * doc.count(d) for d in range(11)] == documents


def test_numerics_is_the_version_the_keys_hash():
    """NUMERICS = 1 hashes "0.1.0", the release string every key was made with before it existed; so the key
    of this fixed config is the one it always was. If this fails, a change moved what a cell key hashes: bump
    ``keys.NUMERICS`` only if that change alters numbers (then regenerate the committed results, "When numbers
    move" in docs/contributing.md); otherwise put the hashed identity back as it was."""
    from posenc_bench.bench import keys

    fixed = config_from_dict(read_results(ROOT / "results/baseline-ci.json")["run"]["config"])  # committed: fixed
    assert keys.NUMERICS == 1 and keys.hashed_numerics(1) == "0.1.0"
    assert cell_key(fixed, Row("rope"), 0, "fp") == "589bd1e96bc00ab2", (
        "the cell key of results/baseline-ci.json's config (rope, seed 0) moved: bump keys.NUMERICS only if "
        "numbers changed; otherwise keep what a key hashes as it was")
    assert keys.hashed_numerics(2) not in ("0.1.0", keys.hashed_numerics(1))  # a bump moves every key


def test_the_release_version_never_enters_a_key(monkeypatch):
    cfg = load_config("configs/ci.yaml")
    before = cell_key(cfg, Row("rope"), 0, "fp"), eval_key(cfg, Row("rope"))
    monkeypatch.setattr("posenc_bench.__version__", "9.9.9")
    assert (cell_key(cfg, Row("rope"), 0, "fp"), eval_key(cfg, Row("rope"))) == before
    monkeypatch.setattr("posenc_bench.bench.keys.NUMERICS", 2)
    assert cell_key(cfg, Row("rope"), 0, "fp") != before[0]


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


def test_vocab_multiple_one_keeps_every_cell_key():
    from posenc_bench.bench.config import RunConfig
    from posenc_bench.bench.keys import cell_key
    from posenc_bench.bench.rows import Row

    cfg = RunConfig()
    key = cell_key(cfg, Row("rope"), 0, "fp")
    assert key == "5d87d934db816d19"  # the key of the default rope cell before the field existed
    cfg.model.vocab_multiple = 64  # another state dict: another checkpoint
    assert cell_key(cfg, Row("rope"), 0, "fp") != key


def test_compiled_training_is_off_by_default_and_keyless():
    from posenc_bench.bench.config import RunConfig
    from posenc_bench.bench.keys import cell_key
    from posenc_bench.bench.records import NOT_IDENTITY
    from posenc_bench.bench.rows import Row

    cfg = RunConfig()
    assert cfg.train.compile is False and "config.train.compile" in NOT_IDENTITY
    key = cell_key(cfg, Row("rope"), 0, "fp")
    cfg.train.compile = True
    assert cell_key(cfg, Row("rope"), 0, "fp") == key


def test_eval_tune_keys_only_the_rows_it_tunes_with_their_grids():
    """``eval.tune`` changes no key of a row without a grid (trained rows, scalings that declare none), and every
    key of a row it tunes: a tuned record is never reused as an untuned one, nor the reverse."""
    base = {"encodings": ["rope", "rope-linear", "rope-rerope", "rope-selfextend"], "train.train_len": 32}
    plain, tuned = load_config(overrides=base), load_config(overrides={**base, "eval.tune": True})
    for name in ("rope", "rope-linear"):
        assert eval_key(plain, Row(name)) == eval_key(tuned, Row(name)), name
    for name in ("rope-rerope", "rope-selfextend"):
        assert eval_key(plain, Row(name)) != eval_key(tuned, Row(name)), name
    held = load_config(overrides={**base, "eval.tune": True, "model.encoding_options": {"rope-rerope": {"window": 8}}})
    assert eval_key(held, Row("rope-rerope")) == eval_key(  # its one option held: nothing left to tune
        load_config(overrides={**base, "model.encoding_options": {"rope-rerope": {"window": 8}}}), Row("rope-rerope"))


def test_key_tokens_key_every_rows_eval_with_the_rule_and_the_evaluators_model_and_only_when_on():
    from posenc_bench.bench.config import RunConfig

    off = RunConfig()
    assert Keys(off, "fp").eval(Row("alibi")) == eval_key(off, Row("alibi"))  # off: the keys results were made with
    on = RunConfig()
    on.eval.key_tokens.evaluator = "rope"
    keys = Keys(on, "fp")
    ident = keys.key_tokens()
    assert (ident["evaluator"], ident["seed"], ident["alpha"], ident["evaluator_model"]) == (
        "rope", on.seeds[0], 2.0, keys.model(Row("rope"), on.seeds[0]))
    assert keys.eval(Row("alibi")) != eval_key(on, Row("alibi")) == eval_key(off, Row("alibi"))
    other = RunConfig()
    other.eval.key_tokens.evaluator, other.eval.key_tokens.beta = "rope", -3.0
    assert Keys(other, "fp").eval(Row("alibi")) != keys.eval(Row("alibi"))
    trained_longer = RunConfig()
    trained_longer.eval.key_tokens.evaluator, trained_longer.train.steps = "rope", on.train.steps + 1
    assert Keys(trained_longer, "fp").key_tokens()["evaluator_model"] != ident["evaluator_model"]
