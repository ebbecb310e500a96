"""`posenc-bench list`, as a user calls it: one line an encoding, with its family and paper."""

import subprocess
import sys


def test_list_and_console_script_exit_codes():
    res = subprocess.run([sys.executable, "-m", "posenc_bench", "list"], capture_output=True, text=True)
    assert res.returncode == 0
    names = [line.split()[0] for line in res.stdout.splitlines()]
    assert names[:4] == ["sinusoidal", "learned", "rope", "rope-partial"] and names[-3:] == ["nope+ssmax", "<name>+sw<W>", "<name>+sink<S>+sw<W>"]
    assert "rope-yarn" in names and "rope-linear-ft" in names and "cope" in names
    lines = {line.split()[0]: line for line in res.stdout.splitlines()}
    assert "relative bias" in lines["fire"] and "arXiv:2310.04418" in lines["fire"]  # family and paper
    bad = subprocess.run([sys.executable, "-m", "posenc_bench", "run", "--encodings", "xpos2"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown encoding 'xpos2'" in bad.stderr
