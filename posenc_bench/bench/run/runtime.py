"""How a process runs the work: one object instead of a dozen parameters passed down every call.

A :class:`Runtime` holds the device, the autocast precision, the torchrun group (or None), whether progress
bars show, and where log lines go. None of it changes a number (the precision is part of a cell's identity
through the config; the Runtime only applies it), so a cell's key never reads it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from posenc_bench.bench.run.dist import Dist
from posenc_bench.env import precision_dtype, resolve_device
from posenc_bench.progress import say
from posenc_bench.values import TRAIN_PRECISIONS

@dataclass
class Runtime:
    device: torch.device
    autocast: Optional[torch.dtype] = None  # None: full fp32
    dist: Optional[Dist] = None  # torchrun: this process's rank and group
    show_progress: Optional[bool] = None  # None: only on a terminal
    log: Callable[[str], None] = say  # print, above any progress bar

    @classmethod
    def create(cls, device: str, precision: str = "fp32", *, dist: Optional[Dist] = None,
               show_progress: Optional[bool] = None, log: Callable[[str], None] = say) -> "Runtime":
        """From the config's names: ``device`` auto | cpu | cuda[:N] (a torchrun group brings its own)."""
        dtype = precision_dtype(precision, TRAIN_PRECISIONS)
        return cls(dist.device if dist is not None else resolve_device(device),
                   None if dtype == torch.float32 else dtype, dist, show_progress, log)

    def autocast_context(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device.type, dtype=self.autocast, enabled=self.autocast is not None)

    @property
    def is_main(self) -> bool:
        return self.dist is None or self.dist.is_main
