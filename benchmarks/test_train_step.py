"""One training step (forward + backward + AdamW) per encoding, at the default model size.

pytest benchmarks/ --benchmark-only            # compare encodings in one table (group per length)
pytest benchmarks/ --benchmark-only --benchmark-json=out.json
Read the ratio of each encoding to `nope` (the fused causal path) measured in the same run; absolute times
on a shared machine are noisy.
"""

import pytest
import torch
import torch.nn.functional as F

from posenc_bench import encodings
from posenc_bench.model.transformer import DecoderLM, ModelConfig

TRAINED = [n for n in encodings.available() if encodings.get_class(n).trained_as is None]


@pytest.mark.parametrize("length", [128, 512])
@pytest.mark.parametrize("name", TRAINED)
def test_train_step(benchmark, name, length, fast):
    benchmark.group = f"train step, T={length}"
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4) if fast else ModelConfig()  # fast: the CI smoke
    length = 32 if fast else length
    model = DecoderLM(cfg, name, length, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randint(0, 256, (max(1, 4096 // length), length + 1))

    def step():
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    loss = benchmark(step)
    assert loss == loss  # finite


@pytest.mark.parametrize("name", [n for n in TRAINED if not encodings.out_of_range(n, 128, 512)])
def test_eval_forward_at_4x(benchmark, name, fast):
    benchmark.group = "eval forward, T=512 (4x of 128)"
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4) if fast else ModelConfig()
    model = DecoderLM(cfg, name, 128, seed=0).eval()
    x = torch.randint(0, 256, (1 if fast else 8, 512))
    with torch.inference_mode():
        out = benchmark(model, x)
    assert out.shape == (x.shape[0], 512, 257)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("name", ["rope", "nope"])
def test_compiled_train_step(benchmark, name, compiled, fast):
    """Forward + backward of the default model at 2048 tokens, batch 2, eager or with its blocks compiled
    (``train.compile``); compiling happens before the timed rounds. Read compiled / eager of one encoding."""
    benchmark.group = f"compiled train step, {name}"
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4) if fast else ModelConfig()
    length = 32 if fast else 2048
    model = DecoderLM(cfg, name, length, seed=0)
    model.compile_blocks(compiled)
    batch = torch.randint(0, 256, (2, length + 1))

    def step():
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        model.zero_grad(set_to_none=True)
        return loss.item()

    step()  # compiles (not timed)
    loss = benchmark(step)
    assert loss == loss  # finite
