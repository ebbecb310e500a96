"""How a process runs the work (bench/run/runtime.py): the device and the autocast precision from the config's names,
a precision it cannot train in refused by name, and which process is the main one."""

import types

import pytest
import torch

from posenc_bench.bench.run.runtime import Runtime
from posenc_bench.errors import ConfigError
from posenc_bench.progress import say


def matmul_dtype(runtime):
    a = torch.randn(4, 4)
    with runtime.autocast_context():
        return (a @ a).dtype


def test_fp32_runs_without_autocast():
    rt = Runtime.create("cpu", "fp32")
    assert rt.device == torch.device("cpu") and rt.autocast is None and matmul_dtype(rt) == torch.float32
    assert rt.dist is None and rt.show_progress is None and rt.log is say  # bars on a terminal only; lines printed
    assert Runtime.create("cpu").autocast is None  # fp32 is the default


def test_bf16_autocasts_to_bfloat16_on_the_cpu_inside_its_context_only():
    rt = Runtime.create("cpu", "bf16")
    assert rt.autocast == torch.bfloat16 and matmul_dtype(rt) == torch.bfloat16
    assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32  # outside the context: fp32 again


@pytest.mark.parametrize("precision", ["fp16", "fp8", "BF16"])
def test_a_precision_it_cannot_train_in_is_a_config_error_naming_the_valid_ones(precision):
    with pytest.raises(ConfigError, match=f"precision '{precision}' is not supported here; valid: fp32, bf16$"):
        Runtime.create("cpu", precision)


def test_the_main_process_is_the_only_one_without_torchrun_or_rank_0_with_it():
    assert Runtime.create("cpu").is_main
    for rank in (0, 1):
        dist = types.SimpleNamespace(device=torch.device("cpu"), is_main=rank == 0)  # a torchrun group's rank
        rt = Runtime.create("cuda:3", dist=dist)  # the group brings its own device: the name is not even read
        assert rt.dist is dist and rt.device == torch.device("cpu") and rt.is_main == (rank == 0)
