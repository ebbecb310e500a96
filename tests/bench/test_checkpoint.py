"""Our checkpoints (bench/checkpoint.py): a save read back whole, where each lives, weights checked against the hash
recorded at save, the meta written last as the "finished" marker, and the model of a trained row or of an
eval-only variant of it, with the rows it refuses named in one message."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.bench import checkpoint
from posenc_bench.bench.checkpoint import Checkpoint, CheckpointError
from posenc_bench.bench.config import load_config
from posenc_bench.bench.rows import Row
from posenc_bench.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CFG = load_config(str(ROOT / "configs" / "ci.yaml"), {"model.d_model": 32, "train.train_len": 16})


def meta(row, seed=0, key="k", status="ok"):
    return {"cell_key": key, "config": CFG.to_dict(), "encoding": row.encoding, "window": row.window, "seed": seed,
            "outcome": {"status": status, "reason": None if status == "ok" else "diverged at step 3"}}


def save(out, row, seed=0, key="k"):
    """A trained-looking model of ``row`` (not its seed's weights) saved where the sweep puts it: (folder, model)."""
    model = checkpoint.build_model(CFG, row, seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    path = checkpoint.checkpoint_dir(out, row, seed)
    checkpoint.save(path, model, meta(row, seed, key))
    return path, model


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A results folder with the rope and t5 checkpoints of seed 0, as a run leaves them."""
    out = tmp_path_factory.mktemp("checkpoints") / "out"
    for name in ("rope", "t5"):
        save(out, Row(name))
    return out


@pytest.fixture
def rope_copy(trained, tmp_path):
    """A copy of the rope checkpoint, to damage."""
    return shutil.copytree(trained / "checkpoints" / "rope-seed0", tmp_path / "rope-seed0")


def test_a_save_reads_back_whole_and_loads_into_a_fresh_model(tmp_path):
    path, model = save(tmp_path, Row("rope"), seed=1, key="key-1")
    weights = path / "model.safetensors"
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]  # no temporary left
    ckpt = checkpoint.read(path)
    sha = hashlib.sha256(weights.read_bytes()).hexdigest()
    assert ckpt.meta == {**meta(Row("rope"), 1, "key-1"), "weights_sha256": sha}
    assert ckpt.row == Row("rope") and ckpt.finished_ok and ckpt.config == CFG
    found = checkpoint.find(path, "key-1")
    assert found.path == path and found.meta == ckpt.meta
    assert checkpoint.find(path, "another key") is None and checkpoint.find(tmp_path / "nowhere", "key-1") is None
    assert checkpoint.cell_key_of(path) == "key-1" and checkpoint.cell_key_of(tmp_path / "nowhere") is None
    fresh = found.load_into(checkpoint.build_model(CFG, Row("rope"), seed=7))  # another seed's weights replaced
    assert model.state_dict().keys() == fresh.state_dict().keys()
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in model.state_dict().items())


def test_checkpoints_record_the_hash_of_their_weights(trained):
    import hashlib

    meta = json.loads((trained / "checkpoints" / "t5-seed0" / "config.json").read_text())
    data = (trained / "checkpoints" / "t5-seed0" / "model.safetensors").read_bytes()
    assert meta["weights_sha256"] == hashlib.sha256(data).hexdigest()
    assert not [p for p in (trained / "checkpoints").rglob("*") if ".tmp" in p.name]


def test_a_checkpoint_lives_under_its_rows_name_and_seed(tmp_path):
    where = tmp_path / "checkpoints" / "rope+sw64-seed2"
    assert checkpoint.checkpoint_dir(tmp_path, Row("rope", 64), 2) == where
    assert checkpoint.checkpoint_dir(str(tmp_path), Row.parse("rope+sw64"), 2) == where
    assert checkpoint.checkpoint_dir(tmp_path, Row("rope-linear-ft"), 0).name == "rope-linear-ft-seed0"  # its own
    assert Checkpoint(tmp_path, {"encoding": "rope", "window": 64}).row == Row.parse("rope+sw64")
    assert Checkpoint(tmp_path, {"encoding": "rope", "window": None}).row == Row("rope")


def test_a_truncated_weights_file_is_refused_naming_its_folder(rope_copy):
    weights = rope_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    ckpt = checkpoint.find(rope_copy, "k")  # its meta is whole: found, then refused when the weights are read
    fresh = checkpoint.build_model(CFG, Row("rope"), 0)
    for load, message in ((lambda: ckpt.load_into(fresh), "does not match the hash"),
                          (lambda: checkpoint.load_model(rope_copy), "does not match the hash"),
                          (lambda: checkpoint.encoding_state(rope_copy), "does not match its recorded hash")):
        with pytest.raises(CheckpointError, match=message) as e:
            load()
        assert repr(str(rope_copy)) in str(e.value) and "\n" not in str(e.value)
    meta = json.loads((rope_copy / "config.json").read_text())
    del meta["weights_sha256"]  # written before the hash was recorded: safetensors' own parsing refuses it
    (rope_copy / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="model.safetensors cannot be read"):
        checkpoint.load_model(rope_copy)


def test_the_meta_is_written_last_so_weights_alone_are_no_checkpoint(rope_copy, monkeypatch):
    old_meta = (rope_copy / "config.json").read_text()
    (rope_copy / "config.json").unlink()  # a save stopped between its weights and its meta
    assert checkpoint.find(rope_copy, "k") is None and checkpoint.cell_key_of(rope_copy) is None
    with pytest.raises(CheckpointError, match="is not a posenc-bench checkpoint folder"):
        checkpoint.read(rope_copy)
    (rope_copy / "config.json").write_text(old_meta)

    def disk_full(path, write):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "atomic_write", disk_full)  # saving over it fails while writing the weights
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(rope_copy, checkpoint.build_model(CFG, Row("rope"), 1), meta(Row("rope"), key="new"))
    assert not (rope_copy / "config.json").exists()  # the old meta went first: it describes none of what is there
    assert checkpoint.find(rope_copy, "k") is None


def test_a_folder_that_is_not_a_whole_checkpoint_is_refused(rope_copy):
    (rope_copy / "model.safetensors").unlink()  # finished, but its weights are gone: damaged, not unfinished
    with pytest.raises(CheckpointError, match="has no model.safetensors"):
        checkpoint.find(rope_copy, "k")
    (rope_copy / "config.json").write_text('{"cell_key": "k", "seed": 0}')
    with pytest.raises(CheckpointError, match="its config.json has no config, encoding, window, outcome"):
        checkpoint.read(rope_copy)
    (rope_copy / "config.json").write_text('{"cell_key": ')
    with pytest.raises(CheckpointError, match="JSONDecodeError"):
        checkpoint.read(rope_copy)
    assert checkpoint.cell_key_of(rope_copy) is None


def test_a_diverged_run_keeps_its_meta_alone_and_gives_no_model(rope_copy):
    checkpoint.save(rope_copy, None, meta(Row("rope"), status="diverged"))
    assert [p.name for p in rope_copy.iterdir()] == ["config.json"]  # the old weights are gone too
    ckpt = checkpoint.find(rope_copy, "k")
    assert not ckpt.finished_ok and "weights_sha256" not in ckpt.meta
    with pytest.raises(CheckpointError, match="holds no weights: its training diverged at step 3"):
        checkpoint.load_model(rope_copy)


def test_load_model_gives_the_trained_row_or_an_eval_only_variant_of_it(trained):
    path = trained / "checkpoints" / "rope-seed0"
    model, ckpt = checkpoint.load_model(path)
    assert type(model.encoding) is encodings.get_class("rope") and not model.training and ckpt.row == Row("rope")
    yarn, ckpt = checkpoint.load_model(path, encoding="rope-yarn", device="cpu")
    assert type(yarn.encoding) is encodings.get_class("rope-yarn") and not yarn.training and ckpt.row == Row("rope")
    mine = {k: v for k, v in model.state_dict().items() if not k.startswith("encoding.")}
    assert mine and all(torch.equal(v, yarn.state_dict()[k]) for k, v in mine.items())  # the rope model's weights
    x = torch.randint(0, 257, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # and at the train length, YaRN's factor is 1: plain rope
        torch.testing.assert_close(yarn(x), model(x))


@pytest.mark.parametrize("folder, encoding, message", [
    ("rope-seed0", "alibi", "encoding 'alibi' does not evaluate the trained 'rope' model; variants of it: rope-linear"),
    ("t5-seed0", "rope-yarn", "encoding 'rope-yarn' does not evaluate the trained 't5' model; variants of it: (none)"),
    ("rope-seed0", "rope-linear-ft", "encoding 'rope-linear-ft' is fine-tuned: give its own checkpoint "
                                     "(checkpoints/rope-linear-ft-seed<s>), not the 'rope' one"),
], ids=["alibi on rope", "rope-yarn on t5", "a -ft row on rope"])
def test_load_model_refuses_a_row_that_does_not_evaluate_that_model(trained, folder, encoding, message):
    with pytest.raises(ConfigError) as e:
        checkpoint.load_model(trained / "checkpoints" / folder, encoding)
    assert message in str(e.value)


def test_encoding_state_is_the_trained_encodings_own_tensors(trained):
    model, _ = checkpoint.load_model(trained / "checkpoints" / "t5-seed0")
    state, expected = checkpoint.encoding_state(trained / "checkpoints" / "t5-seed0"), model.encoding.state_dict()
    assert state and state.keys() == expected.keys() and all(torch.equal(v, expected[k]) for k, v in state.items())
    with pytest.raises(CheckpointError, match="is not a posenc-bench checkpoint folder"):
        checkpoint.encoding_state(trained / "nowhere")


def test_the_row_a_checkpoint_is_evaluated_as_is_named_by_row():
    """``evaluated_row`` (what `passkey` labels its model with): sinks added to the model trained with a window
    are rope+sw64+sink4, not the zero-shot rope+sink4+sw64 row."""
    from types import SimpleNamespace

    from posenc_bench.bench.rows import Row

    windowed = SimpleNamespace(row=Row("rope", 64))
    assert checkpoint.evaluated_row(windowed).name == "rope+sw64"
    assert checkpoint.evaluated_row(windowed, "rope+sink4").name == "rope+sw64+sink4"
    assert checkpoint.evaluated_row(windowed, "rope-yarn").name == "rope-yarn+sw64"


def test_a_padded_vocabulary_checkpoint_reloads_with_its_padding(tmp_path):
    """model.vocab_multiple is in the saved config: the padded weights load back into a padded model."""
    cfg = load_config(str(ROOT / "configs" / "ci.yaml"), {"model.d_model": 32, "train.train_len": 16,
                                                           "model.vocab_multiple": 64})
    model = checkpoint.build_model(cfg, Row("rope"), 0)
    assert model.tok_emb.weight.shape[0] == 320 and model.lm_head.weight is model.tok_emb.weight
    path = checkpoint.checkpoint_dir(tmp_path, Row("rope"), 0)
    checkpoint.save(path, model, {**meta(Row("rope")), "config": cfg.to_dict()})
    loaded, ckpt = checkpoint.load_model(path)
    assert ckpt.config.model.vocab_multiple == 64 and loaded.lm_head.weight is loaded.tok_emb.weight
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in model.state_dict().items())
    idx = torch.randint(0, 257, (1, 16))
    assert torch.equal(model.eval()(idx), loaded(idx)) and loaded(idx).shape == (1, 16, 257)
