"""Small C kernels compiled on first use and loaded with ctypes: an encoding's per-row work fused into one pass
over each row where torch would take one pass (and one fresh tensor) per operation.

``load(name, source)`` compiles ``source`` with the system's C compiler (``$CC``, else ``cc``) into a shared
library kept under the user's cache (``$XDG_CACHE_HOME/posenc-bench/native``, else
``~/.cache/posenc-bench/native``), named by a hash of the source, the flags, the compiler and the CPU, so an
edited kernel, another compiler or another machine's CPU gets its own build (the flags include
``-march=native``). The file is written under a temporary name and renamed, so processes compiling at once
(DDP ranks) never load a half-written library. Where there is no compiler, or it fails, ``load`` returns None
and says why in ``why_not(name, source)``: callers keep a torch path that computes the same values, and use it.

The kernels run their rows on OpenMP threads. Built with ``-fopenmp``, the library binds to the process's
``libgomp.so.1``, which on Linux is the copy torch loaded (the kernels' modules import torch before they
load): one thread pool, sized by ``torch.get_num_threads()``, so the kernels' threads never compete with
torch's idle ones.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Optional

import torch

FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-fPIC", "-shared")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "posenc-bench" / "native"


def _cpu() -> str:
    """What ``-march=native`` compiles for: the CPU's model and feature flags (Linux), else its name."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = [line for line in lines if line.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(wanted)))


def _compiler() -> Optional[str]:
    return shutil.which(os.environ.get("CC", "cc"))


@functools.cache
def compiler_version() -> Optional[str]:
    """The C compiler's first ``--version`` line (recorded with every result: the kernels' numbers depend on
    it), or None where there is none."""
    compiler = _compiler()
    if compiler is None:
        return None
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return (done.stdout.strip().splitlines() or [None])[0]


def _build(name: str, source: str) -> tuple[Optional[ctypes.CDLL], str]:
    """(the library, "") or (None, why not)."""
    compiler = _compiler()
    if compiler is None:
        return None, f"no C compiler found (${{CC}} or cc: {os.environ.get('CC', 'cc')!r})"
    key = hashlib.sha256("\0".join((source, " ".join(FLAGS), compiler, _cpu())).encode()).hexdigest()[:16]
    path = cache_dir() / f"{name}-{key}.so"
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
                src, out = Path(tmp) / f"{name}.c", Path(tmp) / f"{name}.so"
                src.write_text(source)
                done = subprocess.run([compiler, *FLAGS, str(src), "-o", str(out)], capture_output=True, text=True,
                                      timeout=120)
                if done.returncode != 0:
                    last = (done.stderr.strip().splitlines() or ["no message"])[-1]
                    return None, f"{compiler} failed on the {name} kernel: {last}"
                os.replace(out, path)  # atomic: a concurrent build replaces it with the same bytes
        except (OSError, subprocess.SubprocessError) as err:
            return None, f"could not build the {name} kernel in {path.parent}: {err}"
    try:
        return ctypes.CDLL(str(path)), ""
    except OSError as err:
        return None, f"could not load {path}: {err}"


@functools.cache
def _load(name: str, source: str) -> tuple[Optional[ctypes.CDLL], str]:
    return _build(name, source)


def load(name: str, source: str, signatures: Optional[dict] = None) -> Optional[ctypes.CDLL]:
    """The compiled kernel library ``name`` built from C ``source`` (once a process), or None where it cannot
    be built here (``why_not`` says why). ``signatures``: {function: ctypes argument types}, set on first use."""
    lib = _load(name, source)[0]
    for function, argtypes in (signatures or {}).items() if lib is not None else ():
        if getattr(lib, function).argtypes is None:
            getattr(lib, function).argtypes = argtypes
    return lib


def why_not(name: str, source: str) -> str:
    """Why ``load(name, source)`` returned None ("" where it did not)."""
    return _load(name, source)[1]


def loaded(name: str, source: str, signatures: dict, what: str) -> bool:
    """Whether kernel library ``name`` is built here; where it is not, a RuntimeWarning (shown once per place)
    that ``what`` runs on its torch ops instead, and why."""
    if load(name, source, signatures) is not None:
        return True
    warnings.warn(f"{what} runs on torch ops, slower: {why_not(name, source)}", RuntimeWarning, 3)
    return False


def pointer(t: Optional[torch.Tensor], dtype: torch.dtype = torch.float32) -> Optional[int]:
    """The address a kernel reads ``t`` at (None: NULL), which must be a contiguous CPU tensor of ``dtype``."""
    if t is None:
        return None
    assert t.is_contiguous() and t.dtype == dtype and t.device.type == "cpu", (t.shape, t.dtype)
    return t.data_ptr()
