"""Files that are never half-written: atomic writes (a temporary file, fsync, rename) and content hashes; and
where a user's outputs go when no --out names a folder (``RUNS``, never a committed results folder)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable


# A user's runs, evals, timings and figures go under this folder unless --out names another: git ignores it, so
# a run from a clone never writes into (or deletes) the committed results/ folders a config names.
RUNS = "runs"


def user_folder(config_out: str | Path) -> str:
    """Where a run writes when no --out names a folder: the config's results folder moved under RUNS
    (results/default -> runs/default, results/tasks/copy -> runs/tasks/copy; any other path under RUNS as is)."""
    parts = Path(config_out).parts
    parts = parts[1:] if parts[:1] == ("results",) else tuple(p for p in parts if p not in ("/", ".."))
    return str(Path(RUNS, *parts))


def atomic_write(path: Path | str, write: Callable[[str], None]) -> None:
    """``write(tmp)`` to a temporary file beside ``path``, fsync it, then rename it over ``path``.

    A reader sees the old file or the new one, never half of one; a failed write leaves no temporary behind.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; results are ordinary files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path | str, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def atomic_write_json(path: Path | str, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=False) + "\n")


def file_hash(paths: list[Path]) -> str:
    """A fingerprint of ``paths``: sha256 over each file's name, a NUL byte and its contents (in name order),
    16 hex digits. Not a file's own sha256 (``sha256sum`` gives another value): the name is hashed too."""
    h = hashlib.sha256()
    for p in sorted(paths, key=lambda p: p.name):
        h.update(p.name.encode() + b"\0")
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()[:16]
