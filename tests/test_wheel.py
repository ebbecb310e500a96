"""The package on its own: the built wheel, installed (not editable) into a fresh virtual environment with
only torch before it, runs the named built-in configs from a folder that is not a checkout.

Slow (a virtual environment and the dependencies' install: minutes): `pytest -m slow tests/test_wheel.py`.
``POSENC_BENCH_WHEEL`` names an already built wheel (.ci/run builds one with ``python -m build``); without it
the test builds one with pip.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"  # first, pinned: an unpinned torch would pull a multi-GB CUDA build


def _run(cmd, cwd, timeout=900):
    res = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                         env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")})
    assert res.returncode == 0, f"{' '.join(map(str, cmd))} exited {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout


def _wheel(tmp: Path) -> Path:
    given = os.environ.get("POSENC_BENCH_WHEEL")
    if given:
        return Path(given)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", tmp / "dist", ROOT], tmp)
    (wheel,) = (tmp / "dist").glob("posenc_bench-*.whl")
    return wheel


@pytest.mark.slow
def test_the_wheel_alone_runs_the_named_configs(tmp_path):
    from posenc_bench import __version__

    wheel = _wheel(tmp_path)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], tmp_path)
    py, cli = venv / "bin" / "python", venv / "bin" / "posenc-bench"
    _run([py, "-m", "pip", "install", "--quiet", TORCH], tmp_path)
    _run([py, "-m", "pip", "install", "--quiet", wheel], tmp_path)
    work = tmp_path / "elsewhere"  # no configs/ folder, no source tree on the path
    work.mkdir()
    located = _run([py, "-c", "import posenc_bench; print(posenc_bench.__file__)"], work)
    assert str(venv) in located and str(ROOT) not in located  # the installed copy, not the checkout
    assert _run([cli, "--version"], work).strip() == f"posenc-bench {__version__}"
    assert "rope-linear" in _run([cli, "list"], work)
    assert "long-2048" in _run([cli, "configs"], work)
    _run([cli, "run", "--config", "ci", "--encodings", "nope", "--seeds", "1", "--steps", "30", "--eval-tokens",
          "2048", "--out", "out", "--progress", "off"], work)
    table = _run([cli, "report", "out"], work)
    assert "| nope " in table and "4x (256)" in table
