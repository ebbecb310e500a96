"""results.json: the one schema that tables, plots and gates read. Written atomically.

File layout::

    {"schema_version": 1, "run": {config, corpus, eval fingerprint, versions, device, git commit, ...},
     "records": [ {encoding, seed, train_len, eval_len, ratio, status, reason, ppl, bpb, loss, tokens, ...} ]}

One record per (encoding row, seed, eval length). ``status`` is "ok", "n/a" (the encoding cannot run at that
length; ``reason`` says why) or "diverged" (training blew up; ``reason`` has the step and last finite loss).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

from posenc_bench.errors import PosencError

SCHEMA_VERSION = 1
STATUSES = ("ok", "n/a", "diverged")


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


class ResultsError(PosencError):
    pass


def read_results(path: Path | str) -> dict:
    """Load and check a results.json (or a folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    if not path.is_file():
        raise ResultsError(f"no results file at {str(path)!r}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ResultsError(f"{str(path)!r} is not valid JSON (truncated or corrupt?): {e}") from None
    if not isinstance(data, dict) or "records" not in data or "run" not in data:
        raise ResultsError(f"{str(path)!r} is not a posenc-bench results file (no 'run' and 'records')")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ResultsError(f"{str(path)!r} has schema_version {data.get('schema_version')!r}; this version reads {SCHEMA_VERSION}")
    return data


class ResultsStore:
    """The records of one output folder; replaces a cell's records and rewrites the file atomically."""

    def __init__(self, path: Path | str, run: dict, records: Iterable[dict] = ()) -> None:
        self.path = Path(path)
        self.run = run
        self.records = list(records)

    def cell(self, encoding: str, seed: int) -> list[dict]:
        return [r for r in self.records if r["encoding"] == encoding and r["seed"] == seed]

    def put_cell(self, encoding: str, seed: int, records: list[dict]) -> None:
        self.records = [r for r in self.records if not (r["encoding"] == encoding and r["seed"] == seed)]
        self.records.extend(records)
        self.save()

    def as_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "run": self.run, "records": self.records}

    def save(self) -> None:
        atomic_write_json(self.path, self.as_dict())
