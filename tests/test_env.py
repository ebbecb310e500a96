"""Where a number was measured: the commit, and when it counts as dirty; the CPU, its instruction set and pins;
the peak memory of a measurement."""

import platform
import subprocess
from pathlib import Path

import pytest
import torch

from posenc_bench.env import (ISA_PINS, cpu_name, device_description, git_commit, in_words, peak_memory,
                              threads_in_words)


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


@pytest.fixture
def avx512_machine(monkeypatch):
    """A machine that has AVX512, with no ISA pinned unless a test sets the variables."""
    for var in ISA_PINS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: True, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx2_supported", lambda: True, raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    return monkeypatch


def test_cpu_name_says_the_instruction_set_torch_uses(avx512_machine):
    name = cpu_name()
    assert name.endswith(" (AVX512)") and not name.startswith(" (")  # a model name before it
    assert device_description(torch.device("cpu")) == f"cpu:{name[:-1]}; {torch.get_num_threads()} threads)"


def test_cpu_name_says_what_the_machine_has_and_what_it_is_pinned_to(avx512_machine):
    # as the committed results were made: torch's kernels, MKL and oneDNN all held to AVX2
    avx512_machine.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")  # what ATEN_CPU_CAPABILITY does
    for var, value in (("ATEN_CPU_CAPABILITY", "avx2"), ("MKL_CBWR", "AVX2,STRICT"), ("MKL_ENABLE_INSTRUCTIONS", "AVX2"),
                       ("ONEDNN_MAX_CPU_ISA", "AVX2")):
        avx512_machine.setenv(var, value)
    assert cpu_name().endswith(" (AVX512 pinned to AVX2)")
    assert cpu_name(threads=2).endswith(" (AVX512 pinned to AVX2; 2 threads)")
    avx512_machine.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")  # pins that disagree are named one by one
    assert cpu_name().endswith(" (AVX512 pinned to ATEN_CPU_CAPABILITY=avx2, MKL_CBWR=AVX2,STRICT, "
                               "MKL_ENABLE_INSTRUCTIONS=AVX2, ONEDNN_MAX_CPU_ISA=AVX512_CORE)")


def test_cpu_name_names_the_model(avx512_machine, monkeypatch):
    cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC 7B13 64-Core Processor\nflags\t\t: avx2\n"
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: cpuinfo if str(self) == "/proc/cpuinfo"
                        else real(self, *a, **k))
    assert cpu_name() == "AMD EPYC 7B13 64-Core Processor (AVX512)"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: "processor\t: 0\n")  # no model name (some ARM kernels)
    monkeypatch.setattr(platform, "processor", lambda: "")
    assert cpu_name() == f"{platform.machine()} (AVX512)"


def test_a_line_for_a_person_says_1_thread_while_the_record_keeps_1_threads(avx512_machine):
    """The recorded device string is compared by the gate and printed in committed captions: it keeps
    "1 threads"; the run's summary and `time`'s first line say it in words."""
    assert cpu_name(threads=1).endswith(" (AVX512; 1 threads)")  # recorded: unchanged
    assert [threads_in_words(n) for n in (1, 2, 16)] == ["1 thread", "2 threads", "16 threads"]
    assert in_words("cpu:AMD EPYC (AVX512; 1 threads)") == "cpu:AMD EPYC (AVX512; 1 thread)"
    assert in_words("cpu:AMD EPYC (AVX512; 1 threads) x2 (gloo)") == "cpu:AMD EPYC (AVX512; 1 thread) x2 (gloo)"
    for kept in ("cpu:AMD EPYC (AVX512; 11 threads)", "cpu:AMD EPYC (AVX512; 2 threads)", "cuda:NVIDIA H100"):
        assert in_words(kept) == kept


def test_peak_memory_sees_a_large_allocation():
    with peak_memory(torch.device("cpu")) as mem:
        big = torch.ones(64 << 20, dtype=torch.float32)  # 256 MiB, touched
        big += 1
    del big
    if mem["peak_memory_bytes"] is None:
        pytest.skip("no /proc/self/clear_refs here")
    assert mem["peak_memory_kind"] == "process peak RSS" and mem["peak_memory_bytes"] >= 256 << 20
