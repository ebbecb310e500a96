import os

import pytest
import torch

# Tests are sized for 2 CPU cores; keep torch from oversubscribing a shared CI machine.
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture
def tiny_cfg():
    from posenc_bench.model.transformer import ModelConfig

    return ModelConfig(d_model=32, n_layers=2, n_heads=4)
