"""torch.distributed for one training run over several processes (started by ``torchrun``).

``torchrun --nproc-per-node N -m posenc_bench run ...`` sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT in every process; :func:`from_env` reads them and joins the process group: nccl on CUDA (one GPU
per process, ``cuda:LOCAL_RANK``), gloo on CPU. Without those variables it returns ``None`` and nothing in
the package touches ``torch.distributed``.

Roles: rank 0 runs the sweep as a single process would (reads and writes the output folder, evaluates);
the other ranks only ever train. Rank 0 tells them what to train over a gloo "control" group with a long
timeout, so they can wait through rank 0's evaluation without tripping an NCCL watchdog.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as tdist

from posenc_bench.errors import ConfigError

# How long a rank waits for the next command from rank 0 (rank 0 may be evaluating meanwhile). If rank 0
# dies, torchrun ends the other workers itself; this only bounds a hang outside torchrun.
CONTROL_TIMEOUT = datetime.timedelta(hours=12)


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    backend: str  # "gloo" | "nccl"
    device: torch.device
    control: Any  # a gloo process group for broadcast_object_list between ranks

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj: Any = None) -> Any:
        """Rank 0's ``obj`` on every rank (pickled, over the gloo control group)."""
        box = [obj if self.is_main else None]
        tdist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of a scalar tensor over all ranks (on the training backend)."""
        value = value.detach().clone()
        tdist.all_reduce(value, op=tdist.ReduceOp.SUM)
        return value / self.world_size

    def describe(self) -> str:
        return f"DDP {self.world_size} processes, {self.backend}"

    def close(self) -> None:
        if tdist.is_initialized():
            tdist.destroy_process_group()


def _env_int(name: str) -> Optional[int]:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer (set by torchrun)") from None


def from_env(device_name: str) -> Optional[Dist]:
    """Join the process group torchrun describes in the environment, or ``None`` for a single process.

    ``device_name`` is the config's ``device``: auto | cpu | cuda. Under torchrun every process takes
    ``cuda:LOCAL_RANK`` (nccl) or the CPU (gloo); a fixed ``cuda:N`` would put every rank on one GPU.
    """
    world = _env_int("WORLD_SIZE")
    if world is None or world <= 1:
        return None
    rank, local_rank = _env_int("RANK"), _env_int("LOCAL_RANK")
    if rank is None or local_rank is None:
        raise ConfigError("WORLD_SIZE is set but RANK or LOCAL_RANK is not; start several processes with torchrun")
    if device_name.startswith("cuda:"):
        raise ConfigError(
            f"device {device_name!r} with {world} processes would put every rank on one GPU; under torchrun "
            "use device cuda (or auto): each process takes cuda:LOCAL_RANK"
        )
    use_cuda = device_name == "cuda" or (device_name == "auto" and torch.cuda.is_available())
    if use_cuda:
        if not torch.cuda.is_available():
            raise ConfigError(f"device 'cuda' requested but CUDA is not available (torch {torch.__version__}); "
                              "valid devices here: cpu, auto")
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPU(s) visible; "
                              "use --nproc-per-node <= the number of GPUs")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    elif device_name in ("cpu", "auto"):
        device, backend = torch.device("cpu"), "gloo"
    else:
        raise ConfigError(f"unknown device {device_name!r}; valid devices under torchrun: auto, cpu, cuda")
    tdist.init_process_group(backend, rank=rank, world_size=world)
    control = tdist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    return Dist(rank, world, local_rank, backend, device, control)


def rows_of_rank(batch_size: int, dist: Optional[Dist], grad_accum: int) -> tuple[int, int]:
    """(first row, rows) of the global batch this rank trains on; each of its micro-batches is rows/grad_accum.

    Every rank draws the same global batch from the seeded generator and takes its contiguous slice, so the
    global order and the global batch are those of a single process.
    """
    world = dist.world_size if dist is not None else 1
    rank = dist.rank if dist is not None else 0
    if batch_size % (world * grad_accum):
        raise ConfigError(
            f"train.batch_size {batch_size} does not split over {world} process(es) x grad_accum {grad_accum}; "
            f"use a batch size that is a multiple of {world * grad_accum}"
        )
    rows = batch_size // world
    return rank * rows, rows
