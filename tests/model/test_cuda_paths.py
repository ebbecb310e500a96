"""Every attention path on CUDA computes what it computes on the CPU (skipped without a GPU).

The CPU paths are checked against the textbook attention elsewhere (test_attention.py, test_explicit.py); on
CUDA several of them take other kernels (the parts path's explicit log-sum-exp instead of SDPA's CPU flash
kernel, a bias mask instead of ALiBi's folded channels, no band kernel for T5's bias), so each is compared here
with the same model on the CPU: the eval forward at 4x the train length in float32, in one chunk and in many,
and the training step's gradients. Run on a GPU machine with ``pytest tests/model/test_cuda_paths.py``.
"""

import copy

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.model import attention
from posenc_bench.model.transformer import DecoderLM, ModelConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (torch.cuda.is_available() is False)")

TRAIN = 32
# every trained encoding and every zero-shot rope row; not the +rand rows, whose positions are drawn from a
# generator on the model's device (a CUDA generator draws other numbers than the CPU's)
TRAINED = [n for n in encodings.trained() if "+rand" not in n]
ROWS = TRAINED + encodings.variants("rope")


def _pair(name: str) -> tuple[DecoderLM, DecoderLM]:
    cpu = DecoderLM(ModelConfig(d_model=64, n_layers=2, n_heads=4), name, TRAIN, seed=0)
    return cpu, copy.deepcopy(cpu).to("cuda")


@pytest.mark.parametrize("chunked", [False, True])  # one chunk per forward; chunks of a few queries
@pytest.mark.parametrize("name", ROWS)
def test_eval_forward_at_4x_is_the_cpus(monkeypatch, name, chunked):
    if chunked:
        monkeypatch.setattr(attention.AttentionPlan, "FOLD_ROWS", 16)
    cpu, gpu = _pair(name)
    T = TRAIN if name == "learned" else 4 * TRAIN  # learned has no position past its train length
    x = torch.randint(0, 256, (2, T), generator=torch.Generator().manual_seed(1))
    for m in (cpu, gpu):
        m.eval()
        m.encoding.set_eval_length(T)
        if chunked:
            m.max_mask_bytes = 4 * 8 * T * 4  # a few queries of (H, q, k) float masks a chunk
    with torch.no_grad():
        want, got = cpu(x), gpu(x.cuda()).cpu()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", TRAINED)
def test_training_gradients_are_the_cpus(name):
    cpu, gpu = _pair(name)
    x = torch.randint(0, 256, (2, TRAIN + 1), generator=torch.Generator().manual_seed(2))
    for m, xs in ((cpu, x), (gpu, x.cuda())):
        m.train()
        logits = m(xs[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), xs[:, 1:].flatten()).backward()
    for (n, p), q in zip(cpu.named_parameters(), gpu.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-3, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")
