"""Files never half-written (files.py): an atomic write gives the old file or the new one, leaves no temporary
behind and makes an ordinary file; a content hash reads contents and names, not the order they are given in."""

import json
import os

import pytest

from posenc_bench.files import atomic_write, atomic_write_json, atomic_write_text, file_hash


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_atomic_write_leaves_no_temporary_and_ordinary_permissions(tmp_path):
    target = tmp_path / "a" / "results.json"
    atomic_write_json(target, {"x": 1})
    assert json.loads(target.read_text()) == {"x": 1}
    assert [p.name for p in target.parent.iterdir()] == ["results.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "results.json"
    atomic_write_json(target, {"old": True})
    with pytest.raises(TypeError):
        atomic_write_json(target, {"bad": object()})
    assert json.loads(target.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_a_writer_that_raises_halfway_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "model.safetensors"
    atomic_write_text(target, "old weights")
    seen = []

    def write(tmp):
        seen.append(tmp)
        with open(tmp, "w") as f:
            f.write("half of the new")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, write)
    assert target.read_text() == "old weights" and [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]
    assert seen[0] != str(target) and os.path.dirname(seen[0]) == str(tmp_path)  # written beside it, under another name


def test_the_new_files_mode_follows_the_umask_not_mkstemps_0600(tmp_path, umask_022):
    atomic_write_text(tmp_path / "a.txt", "a")
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644
    os.umask(0o077)
    atomic_write_text(tmp_path / "a.txt", "b")  # replaced: the new file's mode, not the old one's
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o600


def test_file_hash_reads_contents_and_names_not_the_order_or_the_folder(tmp_path):
    for folder in ("x", "y"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.json").write_text("{}")
        (tmp_path / folder / "b.bin").write_bytes(b"\0" * 10)
    a, b = tmp_path / "x" / "a.json", tmp_path / "x" / "b.bin"
    h = file_hash([a, b])
    assert len(h) == 16 and int(h, 16) >= 0
    assert file_hash([b, a]) == h == file_hash([tmp_path / "y" / "b.bin", tmp_path / "y" / "a.json"])
    assert file_hash([a]) != h
    (tmp_path / "y" / "b.bin").write_bytes(b"\0" * 9 + b"\1")  # one byte changed
    assert file_hash([tmp_path / "y" / "a.json", tmp_path / "y" / "b.bin"]) != h
    (tmp_path / "x" / "c.bin").write_bytes(b"\0" * 10)  # the same bytes under another name
    assert file_hash([a, tmp_path / "x" / "c.bin"]) != h
