"""The README's quick start: two commands from a fresh clone (``dev.py``), exactly as the README prints them;
the tree stays clean after them (runs go under the git-ignored runs/); the README stays short."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def quick_start_commands() -> list[str]:
    """The commands of the README's first code block under "## Quick start", without their comments."""
    section = README.read_text().split("## Quick start", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def test_the_quick_start_is_the_main_job_and_the_test_suite():
    assert quick_start_commands() == ["python3 dev.py run", "python3 dev.py test"]


def test_the_readme_stays_under_15000_bytes_and_promises_no_index_that_lacks_the_package():
    text = README.read_text()
    assert len(text.encode()) <= 15000, "move reference material to docs/"
    assert "pip install posenc-bench" not in text and "not on PyPI" in text
    assert "https://download.pytorch.org/whl/cpu" in text  # where Linux gets the CPU build of torch


def test_the_workflows_run_the_readme_test_command_the_docs_build_and_the_gate():
    tests = yaml.safe_load((ROOT / ".github/workflows/tests.yml").read_text())
    steps = [s.get("run", "") for job in tests["jobs"].values() for s in job["steps"]]
    assert any(s.strip() == "python3 dev.py test" for s in steps)
    assert any("mkdocs build --strict" in s for s in steps)
    assert any("--index-url https://download.pytorch.org/whl/cpu" in s for s in steps)  # the docs job's CPU torch
    gate = yaml.safe_load((ROOT / ".github/workflows/posenc-gate.yml").read_text())
    assert any(s.get("uses") == "./" for s in gate["jobs"]["gate"]["steps"])
    assert "python3 dev.py test" in (ROOT / ".ci/run").read_text()  # CI calls the README's test command


def commands_to_run(commands: list[str], passed: str | None, head: str) -> list[str]:
    """The quick start's commands, less the test command where ``.ci/run`` ran it on this commit (``passed``, its
    POSENC_BENCH_TEST_COMMAND_PASSED: the commit) in its clean checkout and found the tree unchanged after it."""
    return [c for c in commands if not (c == "python3 dev.py test" and passed and passed == head)]


def test_only_ci_on_this_commit_spares_the_test_command():
    commands = quick_start_commands()
    assert commands_to_run(commands, None, "abc") == commands == commands_to_run(commands, "old", "abc")
    assert commands_to_run(commands, "abc", "abc") == ["python3 dev.py run"]
    assert "export POSENC_BENCH_TEST_COMMAND_PASSED=" in (ROOT / ".ci/run").read_text()


@pytest.mark.slow
def test_the_two_readme_commands_run_in_a_fresh_clone_and_leave_its_tree_clean(tmp_path):
    """A new user's first hour: clone, the two commands as printed (a plain python3, not this test's virtual
    environment), then the table, figures and HTML report are there and git status is empty. About 15 minutes
    on 2 cores: the default sweep is most of it (in .ci/run, which ran the test command first, about 12)."""
    clone = tmp_path / "posenc-bench"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "POSENC_BENCH_WHEEL")}
    env["PATH"] = str(Path(getattr(sys, "_base_executable", sys.executable)).parent) + os.pathsep + env["PATH"]
    for command in commands_to_run(quick_start_commands(), os.environ.get("POSENC_BENCH_TEST_COMMAND_PASSED"), head):
        res = subprocess.run(shlex.split(command), cwd=clone, env=env, capture_output=True, text=True, timeout=3600)
        assert res.returncode == 0, f"{command}: {res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    out = clone / "runs" / "default"
    assert (out / "results.json").is_file() and (out / "table.md").is_file() and (out / "report.html").is_file()
    assert (out / "figures" / "ppl_vs_length.png").is_file()
    assert subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout == ""
