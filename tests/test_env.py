"""Where a number was measured: the commit, and when it counts as dirty."""

import subprocess

from posenc_bench.env import git_commit


def test_dirty_means_code_or_configs_not_results_or_docs(tmp_path):
    def git(*args):
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    for name in ("posenc_bench/model.py", "configs/ci.yaml", "results/run/results.json", "README.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("v1\n")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "one")
    sha = git_commit(tmp_path)
    assert len(sha) == 40 and not sha.endswith("-dirty")
    (tmp_path / "results/run/results.json").write_text("rewritten by the run\n")  # a run writing its own folder
    (tmp_path / "README.md").write_text("edited\n")
    assert git_commit(tmp_path) == sha
    (tmp_path / "configs/ci.yaml").write_text("v2\n")
    assert git_commit(tmp_path) == sha + "-dirty"
    git("checkout", "-q", "configs/ci.yaml")
    (tmp_path / "posenc_bench/model.py").write_text("v2\n")
    assert git_commit(tmp_path) == sha + "-dirty"
    assert git_commit(tmp_path / "nowhere") == "unknown"
