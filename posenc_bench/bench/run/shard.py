"""A sweep split over machines: ``run --shard i/n`` runs one part of the cells; ``merge`` joins the parts.

Assignment. The cells of a sweep are (encoding row, seed). Cells that share one trained model (an eval-only
variant such as rope-linear and the rope it evaluates, same window and seed) form one *training unit*, so
no two shards ever train the same checkpoint. The units, sorted by (trained row, seed), are dealt
round-robin: unit k goes to shard k mod n + 1. The assignment therefore depends only on the set of cells
(encodings, window, seeds), never on the order they were listed in nor on any other flag (steps, device,
out, ...); dealing rather than hashing keeps the shards within one unit of each other in size, which is
what bounds the wall time of a SLURM array.

Files. Shard i of n writes ``results.shard-<i>-of-<n>.json`` (the results.json schema plus ``run.shard``)
and its cells' checkpoints into ``--out``, so all shards can share one folder on a shared filesystem.
``merge`` reads those files (or whole results.json files of separate runs), refuses inputs made with
different configs naming the first field that differs, reports missing cells, and writes results.json,
results.csv, table.md and config.yaml as ``run`` does, records in the order an unsharded run writes them.
Several sweeps of one config merge too (seeds 3-4 of some rows added to a sweep of seeds 0-2, each sweep
sharded its own way): each row's seeds then come together, and each sweep's absent shard files are named.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Optional

from posenc_bench.bench.config import RunConfig
from posenc_bench.bench.records import ResultsError, differences, finished, read_results
from posenc_bench.bench.rows import Row
from posenc_bench.errors import ConfigError

SHARD_FILE = re.compile(r"results\.shard-(\d+)-of-(\d+)\.json")


def parse_shard(text: str) -> tuple[int, int]:
    """'3/16' -> (3, 16): shard 3 of 16, counted from 1."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m:
        raise ConfigError(f"--shard {text!r}: expected i/n, shard i of n counted from 1, e.g. 3/16")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 1 <= i <= n:
        raise ConfigError(f"--shard {text!r}: expected i/n with n >= 1 and 1 <= i <= n, e.g. 3/16 (shards 1/{max(n, 1)} .. "
                          f"{max(n, 1)}/{max(n, 1)})")
    return i, n


def shard_file(index: int, count: int) -> str:
    return f"results.shard-{index}-of-{count}.json"


def training_unit(row: Row, seed: int) -> tuple[Row, int]:
    """The (trained row, seed) whose checkpoint a cell starts from: rope-linear+sw64 -> (rope+sw64, seed)."""
    return row.trained, seed


def shard_cells(cells: list[tuple[Row, int]], index: int, count: int) -> list[tuple[Row, int]]:
    """The cells of shard ``index`` of ``count``, in the order of ``cells``."""
    units = sorted({training_unit(row, seed) for row, seed in cells}, key=lambda u: (u[0].name, u[1]))
    mine = {u for k, u in enumerate(units) if k % count == index - 1}
    return [c for c in cells if training_unit(*c) in mine]


def shard_meta(cfg: RunConfig, index: int, count: int) -> dict:
    return {"index": index, "count": count,
            "cells": [[row.name, seed] for row, seed in shard_cells(cfg.cells(), index, count)],
            "all_cells": [[row.name, seed] for row, seed in cfg.cells()]}


# ---- merge ---------------------------------------------------------------------------------------------

def find_inputs(paths: list[str]) -> list[Path]:
    """Result files to merge: a file as given; a folder's shard files, or its results.json if it has none."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            shards = sorted((f for f in p.iterdir() if SHARD_FILE.fullmatch(f.name)),
                            key=lambda f: tuple(int(x) for x in SHARD_FILE.fullmatch(f.name).groups()[::-1]))
            if shards:
                files.extend(shards)
            elif (p / "results.json").is_file():
                files.append(p / "results.json")
            else:
                raise ResultsError(f"{str(p)!r} holds no results.shard-<i>-of-<n>.json and no results.json")
        else:
            raise ResultsError(f"{str(p)!r} is not a results file or a folder")
    unique = list(dict.fromkeys(f.resolve() for f in files))
    if not unique:
        raise ResultsError("nothing to merge: give one or more shard folders or results files")
    return unique


def _expected_cells(run: dict) -> list[tuple[str, int]]:
    if "shard" in run:
        return [tuple(c) for c in run["shard"]["all_cells"]]
    return [(row, seed) for row in run["rows"] for seed in run["config"]["seeds"]]


def _sweeps(files: list[Path], datas: list[dict]) -> dict[frozenset, tuple[Path, list[dict]]]:
    """The shard files grouped by the sweep they split (its set of cells): sweep -> (its first file, the shard
    metas). Several sweeps of one config merge (seeds or rows added by a later sweep); the shards of one sweep
    must come from one --shard i/n split, and each sweep's absent shard files are reported."""
    sweeps: dict[frozenset, tuple[Path, list[dict]]] = {}
    for f, d in zip(files, datas):
        if "shard" in d["run"]:
            sweeps.setdefault(frozenset(map(tuple, d["run"]["shard"]["all_cells"])), (f, []))[1].append(d["run"]["shard"])
    for _, metas in sweeps.values():
        counts = sorted({m["count"] for m in metas})
        if len(counts) > 1:
            raise ResultsError(f"shard files of different splits ({' and '.join(f'n={n}' for n in counts)}); "
                               "merge the shards of one --shard i/n split")
    return sweeps


def merge_results(files: list[Path], out: Optional[Path] = None) -> tuple[dict, list[str], list[str]]:
    """(merged results, missing cells as "rope seed 1", missing shard files). Raises ResultsError for inputs
    that do not belong together."""
    datas = [read_results(f) for f in files]
    ref_file, ref = files[0], datas[0]
    for f, d in zip(files[1:], datas[1:]):
        diffs = differences(ref["run"], d["run"], ref["records"], d["records"])
        if diffs:
            field, a, b = diffs[0]
            raise ResultsError(f"{str(f)!r} was made with a different config than {str(ref_file)!r}: "
                               f"{field} is {b!r} there and {a!r} in the first; merge only shards of one config")
    sweeps = _sweeps(files, datas)
    lengths = set(ref["run"]["eval_lengths"])

    expected = list(dict.fromkeys(c for d in datas for c in _expected_cells(d["run"])))
    if len(sweeps) > 1:  # seeds added later: each row's seeds together, in the order the rows first appear
        rows = list(dict.fromkeys(row for row, _ in expected))
        expected.sort(key=lambda c: (rows.index(c[0]), c[1]))
    cells: dict[tuple[str, int], list[dict]] = {}
    source: dict[tuple[str, int], Path] = {}
    for f, d in zip(files, datas):
        by_cell: dict[tuple[str, int], list[dict]] = {}
        for r in d["records"]:
            by_cell.setdefault((r["encoding"], r["seed"]), []).append(r)
        for cell, recs in by_cell.items():
            if not finished(recs, lengths):
                continue  # unfinished: counts as missing unless another input has it
            if cell in cells:
                a, b = cells[cell][0], recs[0]
                if (a["cell_key"], a["eval_key"]) != (b["cell_key"], b["eval_key"]):
                    raise ResultsError(f"cell {cell[0]} seed {cell[1]} is in {str(source[cell])!r} and {str(f)!r} "
                                       "with different training or evaluation; merge only shards of one config")
                continue
            cells[cell], source[cell] = sorted(recs, key=lambda r: r["eval_len"]), f
            if cell not in expected:
                expected.append(cell)

    missing = [f"{row} seed {seed}" for row, seed in expected if (row, seed) not in cells]
    absent: list[str] = []
    for first, shard_runs in sweeps.values():
        n = shard_runs[0]["count"]
        where = f"{first.parent}/" if len(sweeps) > 1 else ""  # which sweep's file, when there are several
        absent += [where + shard_file(i, n) for i in sorted(set(range(1, n + 1)) - {s["index"] for s in shard_runs})]

    order = {c: k for k, c in enumerate(expected)}
    run = copy.deepcopy(ref["run"])
    run.pop("shard", None)
    present = [c for c in expected if c in cells]
    run["rows"] = list(dict.fromkeys(row for row, _ in present))
    run["config"]["encodings"] = list(dict.fromkeys(
        e for d in datas for e in d["run"]["config"]["encodings"]))
    run["config"]["seeds"] = sorted({s for d in datas for s in d["run"]["config"]["seeds"]})
    if out is not None:
        run["config"]["out"] = str(out)
    run["merged_from"] = [
        {"file": str(f), "shard": (f"{d['run']['shard']['index']}/{d['run']['shard']['count']}" if "shard" in d["run"] else None),
         "device": d["run"]["device"], "git_commit": d["run"]["git_commit"], "started": d["run"]["started"]}
        for f, d in zip(files, datas)
    ]
    records = [r for c in sorted(cells, key=order.__getitem__) for r in cells[c]]
    return {"schema_version": ref["schema_version"], "run": run, "records": records}, missing, absent


def merge_into(files: list[Path], out: Path, partial: bool = False) -> tuple[dict, list[str], list[str]]:
    """``merge_results`` written to ``out``/results.json and config.yaml under the folder's lock (a run or
    eval writing there stops it with one line); refused with the missing cells unless ``partial``."""
    import yaml

    from posenc_bench.bench.records import ResultsFolder
    from posenc_bench.files import atomic_write_json, atomic_write_text

    data, missing, absent = merge_results(files, out)
    if missing and not partial:
        raise ResultsError(f"{missing_cells(missing, absent)}; run them, or merge with --partial")
    bpe = kept_tokenizer(files, out, data["run"])
    with ResultsFolder(out):
        atomic_write_json(out / "results.json", data)
        atomic_write_text(out / "config.yaml", yaml.safe_dump(data["run"]["config"], sort_keys=False))
        if bpe is not None and bpe.parent.resolve() != out.resolve():
            atomic_write_text(out / bpe.name, bpe.read_text())
    return data, missing, absent


def kept_tokenizer(files: list[Path], out: Path, run: dict) -> Optional[Path]:
    """The BPE file the merged results were made with (``tokenizer.file_name``), from the inputs' folders or
    ``out``, so the merged folder keeps it for resume, eval and gate; None for bytes or when no folder has it.
    Every copy found must have the fingerprint the runs recorded: another BPE there is refused."""
    from posenc_bench.tokenizer import BPETokenizer, file_name, vocab_size_of

    if not run.get("tokenizer"):
        return None
    name, want = run["tokenizer"]["name"], run["tokenizer"]["fingerprint"]
    found = None
    for folder in dict.fromkeys([out, *(f.parent for f in files)]):
        path = folder / file_name(name)
        if not path.is_file():
            continue
        got = BPETokenizer.from_json(path.read_text(), vocab_size_of(name)).fingerprint
        if got != want:
            raise ResultsError(f"{str(path)!r} is the {name} with fingerprint {got}, but the results were made with "
                               f"{want}; remove it or merge into another folder")
        found = found or path
    return found


def missing_cells(missing: list[str], absent: list[str]) -> str:
    return f"{len(missing)} cell(s) missing: {', '.join(missing)}" + (f" (no {', '.join(absent)})" if absent else "")

