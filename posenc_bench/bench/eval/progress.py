"""An eval row's finished work before the row is whole, so that an interrupted row resumes where it stopped.

A row of a pretrained model is scored at every eval length, and with ``--tune`` each length first scores every
point of the row's grid on the valid text: on a CPU one tuned row of SmolLM2 to 4x its context takes hours,
longer than a machine may stay up. The folder's results file takes a row only when it is whole (its readers
never see half a row); until then each finished length's record and each valid pass's value go to
``eval.partial.json`` beside it, under the row's eval key, written atomically after each. A rerun of the same
command takes them instead of measuring again (another eval key starts the row afresh), and the row's entry is
dropped once the row is whole. The folder's lock (``records.ResultsFolder``) makes its writer the only one.
``posenc-bench needles`` keeps its rows' finished lengths the same way, in ``needles.partial.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from posenc_bench.bench.records import ResultsError
from posenc_bench.files import atomic_write_json

PARTIAL = "eval.partial.json"


def _point_key(length: int, point: dict) -> str:
    return f"{length} {json.dumps(point, sort_keys=True)}"


class RowProgress:
    """Row ``row``'s progress in ``folder``'s file ``name``, kept under ``key`` (what its numbers depend on: its eval
    key), a record (any JSON value) per finished length."""

    def __init__(self, folder: Path, row: str, key: str, name: str = PARTIAL) -> None:
        self.path, self.row = Path(folder) / name, row
        self.data = self._read()  # every row's entry: the folder's one writer holds them all
        entry = self.data.get(row)
        self.entry = entry if entry and entry.get("eval_key") == key else {"eval_key": key, "records": {}, "valid": {}}

    def _read(self) -> dict:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as e:
            data = e
        if not isinstance(data, dict):
            raise ResultsError(f"{self.path}: not a progress file posenc-bench writes ({data}); it holds only unfinished "
                               "rows' work: delete it to measure those rows afresh")
        return data

    def _save(self) -> None:
        self.data[self.row] = self.entry
        atomic_write_json(self.path, self.data)

    def lengths(self) -> list[int]:
        """The eval lengths whose records are kept."""
        return sorted(int(L) for L in self.entry["records"])

    def record(self, length: int) -> Optional[dict | list]:
        return self.entry["records"].get(str(length))

    def keep_record(self, length: int, record: dict | list) -> None:
        self.entry["records"][str(length)] = record
        self._save()

    def valid(self, length: int, point: dict) -> tuple[bool, Optional[float]]:
        """(whether grid point ``point`` was scored on the valid text at ``length``, its value: None where it
        could not run)."""
        key = _point_key(length, point)
        return key in self.entry["valid"], self.entry["valid"].get(key)

    def keep_valid(self, length: int, point: dict, value: Optional[float]) -> None:
        self.entry["valid"][_point_key(length, point)] = value
        self._save()

    def drop(self) -> None:
        """The row is whole: its entry goes (the file too, once no row has one)."""
        self.data.pop(self.row, None)
        if self.data:
            atomic_write_json(self.path, self.data)
        else:
            self.path.unlink(missing_ok=True)
