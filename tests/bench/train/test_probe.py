"""The probe step timed before training: a positive time for the config's batch, torch's random state
left as it was."""

import torch

from posenc_bench.bench.config import load_config
from posenc_bench.bench.rows import Row
from posenc_bench.bench.run.runtime import Runtime
from posenc_bench.bench.train import probe


def test_the_probe_times_a_step_and_leaves_the_random_state_alone():
    cfg = load_config("ci", {"train.batch_size": 8})
    torch.manual_seed(1)
    before = torch.random.get_rng_state()
    seconds = probe.step_seconds(cfg, Row("rope"), Runtime.create("cpu"))
    assert seconds > 0
    assert torch.equal(torch.random.get_rng_state(), before)
