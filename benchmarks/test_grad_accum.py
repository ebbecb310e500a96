"""Cost of gradient accumulation: train() steps at the default model size with the global batch of 16 x 128
tokens cut into 1, 2 or 4 micro-batches (same numbers to fp32 rounding; tests/bench/run/test_dist.py).

pytest benchmarks/test_grad_accum.py --benchmark-only
Read each grad_accum's time as a ratio to grad_accum=1 measured in the same run.
"""

import pytest
import torch

from posenc_bench.bench.config import TrainConfig
from posenc_bench.data import TrainBatches
from posenc_bench.model.transformer import DecoderLM, ModelConfig
from posenc_bench.bench.run.runtime import Runtime
from posenc_bench.bench.train.loop import train

STEPS = 2


@pytest.mark.parametrize("grad_accum", [1, 2, 4])
def test_train_steps_with_grad_accum(benchmark, grad_accum):
    benchmark.group = f"train(), {STEPS} steps of 16 x 128 tokens, rope"
    torch.set_num_threads(2)
    stream = torch.randint(0, 256, (100_000,), generator=torch.Generator().manual_seed(0)).to(torch.int16)
    cfg = TrainConfig(train_len=128, batch_size=16, steps=STEPS, warmup_steps=1, log_every=STEPS)

    def run():
        model = DecoderLM(ModelConfig(), "rope", 128, seed=0)
        return train(model, TrainBatches(stream, 128, 16, seed=0), cfg,
                     Runtime(torch.device("cpu"), show_progress=False), grad_accum=grad_accum)

    out = benchmark.pedantic(run, rounds=3, iterations=1)
    assert out.status == "ok" and out.steps == STEPS
