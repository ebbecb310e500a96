"""Where a number was measured: the device, the precision, the package versions and the git commit."""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Iterable, Iterator, Optional

import torch

from posenc_bench import __version__, native
from posenc_bench.errors import ConfigError
from posenc_bench.values import PRECISIONS


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device {name!r} requested but CUDA is not available (torch {torch.__version__}, "
                f"built with CUDA {torch.version.cuda}); valid devices here: cpu, auto"
            )
        return torch.device(name)
    if name == "cpu":
        return torch.device("cpu")
    raise ConfigError(f"unknown device {name!r}; valid devices: auto, cpu, cuda, cuda:N")


# What makes a number: "-dirty" means these differ from the commit. A run rewriting its own results folder in
# the checkout, or an edited README, does not make its numbers dirty.
CODE_PATHS = ("posenc_bench", "configs", "pyproject.toml")


def git_commit(root: Optional[Path] = None) -> str:
    """HEAD of the checkout the package runs from (or ``root``), with "-dirty" when its code or configs have
    uncommitted changes (CODE_PATHS); "unknown" outside a git checkout."""
    root = root or Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def git_tracked(path: Path) -> bool:
    """Whether git tracks any file under ``path`` (a committed results folder); False outside a git checkout or
    where git cannot say."""
    path = Path(path)
    if not path.exists():
        return False
    where = path if path.is_dir() else path.parent
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", str(path.resolve())], cwd=where, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and bool(out.stdout.strip("\0"))


def short_commit(commit: str) -> str:
    """A commit as captions print it: 12 hex digits, keeping the "-dirty" mark."""
    sha, dirty, _ = commit.partition("-dirty")
    return sha[:12] + ("-dirty" if dirty else "")


def every_value(pairs: Iterable[tuple[str, str]], word: str, default: str = "?", plural: str = "") -> str:
    """Where results were made, in words, from (row, value) pairs (a commit or a device per record): '{word} X'
    where every record shares X (``default`` where there are none), else every value with its rows, '{word}s X
    (rows); Y (rows)' (``plural`` for '{word}s'): a run resumed at another commit or on another machine, whose header
    names the last alone."""
    by_value: dict[str, list[str]] = {}
    for row, value in pairs:
        rows = by_value.setdefault(value, [])
        if row not in rows:
            rows.append(row)
    if len(by_value) <= 1:
        return f"{word} {next(iter(by_value), default)}"
    return f"{plural or word + 's'} " + "; ".join(f"{v} ({', '.join(rows)})" for v, rows in by_value.items())


def made_where(device: Optional[torch.device] = None) -> dict:
    """The fields that say where and with what a number was made, for results built outside ``run_meta`` (the
    retrieval tests'): the code's commit (with "-dirty"), the package versions and, given one, the device."""
    return {"git_commit": git_commit(), "versions": versions(),
            **({"device": device_description(device)} if device is not None else {})}


def versions() -> dict:
    out = {"python": platform.python_version(), "posenc_bench": __version__, "torch": torch.__version__}
    for pkg in ("transformers", "numpy"):
        out[pkg] = version_of(pkg)
    out["cc"] = native.compiler_version()  # builds the CPU kernels (posenc_bench.native)
    return out


def device_description(device: torch.device) -> str:
    """Where a record's numbers were computed: the GPU's name, or the CPU (``cpu_name``) and torch's thread count."""
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"cpu:{cpu_name(threads=torch.get_num_threads())}"


# The variables that pin the CPU libraries to an instruction set (torch's kernels, MKL, oneDNN), as the
# committed CPU results were made: ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
# ONEDNN_MAX_CPU_ISA=AVX2, so that an AVX-512 machine computes (and rounds) like an AVX2 one.
ISA_PINS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def cpu_name(threads: Optional[int] = None) -> str:
    """The CPU: its model name, the instruction set torch's kernels dispatch to, and what it has and what it is
    pinned to when ISA_PINS are set, e.g. "AMD EPYC 7B13 (AVX512)", "AMD EPYC 7B13 (AVX512 pinned to AVX2;
    2 threads)". Two CPU generations, or one machine with and without the pin, round differently: results
    made on them must be told apart."""
    model = ""
    with contextlib.suppress(OSError):
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    used = torch.backends.cpu.get_cpu_capability()  # honours ATEN_CPU_CAPABILITY
    has = next((isa for isa, probe in (("AVX512", "_is_avx512_supported"), ("AVX2", "_is_avx2_supported"))
                if getattr(torch.cpu, probe, lambda: False)()), used)  # the hardware's, whatever is pinned
    pins = {var: os.environ[var] for var in ISA_PINS if os.environ.get(var)}
    isa = used
    if pins:
        agree = {value.split(",")[0].upper() for value in pins.values()} == {used}  # MKL_CBWR=AVX2,STRICT
        isa = f"{has} pinned to " + (used if agree else ", ".join(f"{var}={value}" for var, value in pins.items()))
    # "1 threads" stays as it is: this string is recorded (results.json's device, the table captions, the gate's
    # device check), and committed results say "N threads" for every N; a line for a person says
    # ``in_words(device)`` instead
    details = [isa] + ([f"{threads} threads"] if threads else [])
    return f"{model or platform.processor() or platform.machine()} ({'; '.join(details)})"


def threads_in_words(n: int) -> str:
    """'1 thread', '2 threads'."""
    return f"{n} thread{'' if n == 1 else 's'}"


def in_words(device: str) -> str:
    """A recorded device string (``device_description``) as a progress or summary line says it: '1 thread'
    where the record says '1 threads' (the record itself never changes: see ``cpu_name``)."""
    return re.sub(r"\b1 threads\)", "1 thread)", device)


# The torch dtype of every precision name (values.PRECISIONS: the one vocabulary of --precision): run and time
# autocast to it, eval loads a Hugging Face model's weights in it.
DTYPES = dict(zip(PRECISIONS, (torch.float32, torch.bfloat16, torch.float16)))


def precision_dtype(name: str, valid: tuple[str, ...] = PRECISIONS) -> torch.dtype:
    """The torch dtype of precision ``name``; ConfigError naming the valid ones (of ``valid``) otherwise."""
    if name not in valid:
        raise ConfigError(f"precision {name!r} is not supported here; valid: {', '.join(valid)}")
    return DTYPES[name]


def version_of(package: str) -> Optional[str]:
    """The installed version of ``package``, or None."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


# ---- peak memory ------------------------------------------------------------------------------------------

def process_memory(key: str = "VmRSS") -> Optional[int]:
    """A /proc/self/status figure in bytes (VmRSS: resident now, VmHWM: the peak since the last reset); None off Linux."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    match = re.search(key + r":\s+(\d+) kB", text)
    return int(match.group(1)) * 1024 if match else None


def release_freed_memory() -> None:
    """Give the heap's free pages back to the OS (glibc's malloc_trim), so that a peak RSS measured next counts
    what the block keeps, not what earlier code freed into the heap; nothing where libc has no such call."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0: /proc/self/clear_refs), after
    ``release_freed_memory``; False where that is not possible."""
    release_freed_memory()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@contextlib.contextmanager
def peak_memory(device: torch.device) -> Iterator[dict]:
    """Peak memory of the block, filled in on exit: ``peak_memory_bytes`` and what it counts
    (``peak_memory_kind``): on CUDA the allocator's peak; on CPU the process's peak RSS (everything resident:
    weights and data included; freed memory the allocator keeps counts until reused), None off Linux."""
    out: dict = {"peak_memory_bytes": None, "peak_memory_kind": None}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield out
        torch.cuda.synchronize(device)
        out.update(peak_memory_bytes=torch.cuda.max_memory_allocated(device), peak_memory_kind="cuda max allocated")
        return
    ok = reset_peak_rss()
    yield out
    if ok:
        out.update(peak_memory_bytes=process_memory("VmHWM"), peak_memory_kind="process peak RSS")
