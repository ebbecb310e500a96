"""Data-parallel training (2 CPU processes, gloo) and gradient accumulation against one process.

Tolerance: the 2-process run sums the same gradients in another order (two half-batch means, averaged by
all-reduce, instead of one full-batch mean), so fp32 results differ by rounding only. Measured after 20
AdamW steps (t5, 2 layers): logged losses (rounded to 1e-5) equal, last raw loss within 1e-6, weights
within 2.2e-7 (DDP, DDP x 2 micro-batches, DDP resumed from a 1-process state, 1 process x 2 or 4
micro-batches). Asserted: 1e-5 on losses and on every weight.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from posenc_bench.bench.config import TrainConfig, load_config
from posenc_bench.data import TrainBatches
from posenc_bench.model.transformer import DecoderLM, ModelConfig
from posenc_bench.bench.train.loop import Resume, train
from posenc_bench.bench.run.runtime import Runtime

LOSS_TOL, WEIGHT_TOL = 1e-5, 1e-5
STEPS = 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stream():
    g = torch.Generator().manual_seed(0)
    base = torch.arange(20000) % 37
    return torch.where(torch.rand(20000, generator=g) < 0.1, torch.randint(0, 256, (20000,), generator=g), base).to(torch.int16)


def _cfg():
    return TrainConfig(train_len=16, batch_size=8, steps=STEPS, lr=3e-3, warmup_steps=5, log_every=2)


def _train(dist=None, grad_accum=1, state_path=None, save_every=0, state_key=""):
    model = DecoderLM(ModelConfig(d_model=32, n_layers=2, n_heads=2), "t5", 16, seed=0)
    out = train(model, TrainBatches(_stream(), 16, 8, seed=0), _cfg(), Runtime(torch.device("cpu"), dist=dist, show_progress=False),
                resume=Resume(state_path, save_every, state_key), grad_accum=grad_accum)
    return out, {k: v.clone() for k, v in model.state_dict().items()}


def _interrupted_state(path: Path) -> None:
    """A single-process run stopped in step 13, after its save at step 10."""

    class Stop(Exception):
        pass

    batches = TrainBatches(_stream(), 16, 8, seed=0)
    real, calls = batches.next, []

    def next_or_stop():
        calls.append(1)
        if len(calls) == 13:
            raise Stop
        return real()

    batches.next = next_or_stop
    with pytest.raises(Stop):
        train(DecoderLM(ModelConfig(d_model=32, n_layers=2, n_heads=2), "t5", 16, seed=0), batches, _cfg(),
              Runtime(torch.device("cpu"), show_progress=False), resume=Resume(path, 10, "k"))


def _env(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)


def _worker(rank: int, port: int, tmp: str) -> None:
    """One process of a 2-process gloo job: three training runs, then a sweep (one start-up for all tests)."""
    from posenc_bench.bench.run import dist as distributed
    from posenc_bench.bench.sweep import Sweep, train_worker

    _env(rank, 2, port)
    tmp = Path(tmp)
    # every rank is told its own folder: anything rank 1 wrote would show up in out-rank1
    cfg = load_config("configs/ci.yaml", {**SWEEP, **_data(tmp), "out": str(tmp / f"out-rank{rank}")})
    dist = distributed.from_env(cfg.device)
    try:
        results = {
            "ddp": _train(dist),
            "ddp_accum2": _train(dist, grad_accum=2),
            # rank 0 resumes the single-process state and sends it to rank 1
            "ddp_resumed": _train(dist, state_path=tmp / "train_state.pt" if rank == 0 else None, save_every=10,
                                  state_key="k"),
        }
        if dist.is_main:
            Sweep(cfg, Runtime.create(cfg.device, cfg.precision, dist=dist, show_progress=False, log=lambda line: None)).run()
        else:
            train_worker(cfg, dist)
    finally:
        dist.close()
    torch.save({k: (asdict_outcome(o), w) for k, (o, w) in results.items()}, tmp / "train" / f"rank{rank}.pt")


def asdict_outcome(o):
    return {"status": o.status, "curve": o.curve, "steps": o.steps, "last": o.last_finite_loss}


def _spawn(fn, *args):
    mp.spawn(fn, args=(_free_port(), *args), nprocs=2, join=True)


def _close(a: dict, b: dict, tol: float) -> float:
    worst = max((x - y).abs().max().item() for x, y in zip(a.values(), b.values()))
    assert worst <= tol, worst
    return worst


def _curves_close(a, b, tol):
    assert [s for s, _ in a] == [s for s, _ in b]
    worst = max(abs(x - y) for (_, x), (_, y) in zip(a, b))
    assert worst <= tol, worst


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    """The folder of one 2-process job (see _worker)."""
    tmp = tmp_path_factory.mktemp("ddp")
    (tmp / "train").mkdir()
    (tmp / "corpus").mkdir()
    for f in sorted(Path(__file__).resolve().parents[3].joinpath("posenc_bench").rglob("*.py")):
        (tmp / "corpus" / f.name).write_bytes(f.read_bytes())
    _interrupted_state(tmp / "train_state.pt")
    assert torch.load(tmp / "train_state.pt", weights_only=True)["step"] == 10
    _spawn(_worker, str(tmp))
    return tmp


def test_two_process_ddp_matches_one_process_with_the_same_global_batch(ddp):
    ref, ref_w = _train()
    assert ref.curve[-1][1] < ref.curve[0][1] - 0.3  # it learns: the comparison is not between two constants
    r0 = torch.load(ddp / "train" / "rank0.pt", weights_only=False)
    r1 = torch.load(ddp / "train" / "rank1.pt", weights_only=False)
    for name in ("ddp", "ddp_accum2", "ddp_resumed"):
        (out0, w0), (out1, w1) = r0[name], r1[name]
        assert out0["status"] == "ok" and out0["steps"] == STEPS
        assert out0["curve"] == out1["curve"]  # the logged loss is the global mean, the same on every rank
        assert all(torch.equal(w0[k], w1[k]) for k in w0)  # DDP keeps the replicas bit-identical
        _curves_close(out0["curve"], ref.curve, LOSS_TOL)
        assert out0["last"] == pytest.approx(ref.last_finite_loss, abs=LOSS_TOL)
        _close(w0, ref_w, WEIGHT_TOL)
    # only the single-process run wrote the state file (rank 0 only read it)
    assert torch.load(ddp / "train_state.pt", weights_only=True)["step"] == 10


def test_gradient_accumulation_equals_the_full_batch():
    ref, ref_w = _train()
    for accum in (2, 4):
        out, w = _train(grad_accum=accum)
        _curves_close(out.curve, ref.curve, LOSS_TOL)
        assert out.last_finite_loss == pytest.approx(ref.last_finite_loss, abs=LOSS_TOL)
        _close(w, ref_w, WEIGHT_TOL)
        assert not all(torch.equal(w[k], ref_w[k]) for k in w)  # really another summation order, not a no-op


def test_a_batch_that_does_not_split_is_a_clear_error():
    from posenc_bench.errors import ConfigError

    with pytest.raises(ConfigError, match="batch_size 8 does not split over 1 process.*grad_accum 3"):
        _train(grad_accum=3)
    with pytest.raises(ConfigError, match="grad_accum must be >= 1 and divide train.batch_size 16"):
        load_config("configs/ci.yaml", {"grad_accum": 3})


# ---- the sweep on 2 processes: same numbers, and rank 1 writes nothing --------------------------------

SWEEP = {"encodings": ["rope", "rope-linear", "alibi"], "seeds": [0], "device": "cpu", "threads": 1,
         "save_every": 4, "model.d_model": 32, "model.n_layers": 1, "model.n_heads": 2,
         "train.train_len": 16, "train.batch_size": 8, "train.steps": 10, "train.warmup_steps": 2,
         "train.log_every": 2, "eval.tokens": 256, "eval.lens": ["1x", "2x"]}


def _data(tmp: Path) -> dict:
    """This package's own source files as a small corpus (the stdlib takes seconds to load in each process)."""
    return {"data.source": str(tmp / "corpus"), "data.test_fraction": 0.3, "data.valid_fraction": 0.0}


def _numbers(data):
    return {(r["encoding"], r["eval_len"]): (r["status"], r["ppl"], r["train_final_loss"]) for r in data["records"]}


def test_two_process_sweep_gives_the_single_process_numbers_and_only_rank_0_writes(ddp, tmp_path):
    from posenc_bench.bench.sweep import Sweep

    assert not (ddp / "out-rank1").exists()
    out0 = ddp / "out-rank0"
    data = json.loads((out0 / "results.json").read_text())
    cfg = load_config("configs/ci.yaml", {**SWEEP, **_data(ddp), "out": str(tmp_path / "single")})
    single = Sweep(cfg, Runtime.create(cfg.device, cfg.precision, show_progress=False, log=lambda line: None)).run()
    a, b = _numbers(data), _numbers(single)
    assert a.keys() == b.keys() and len(a) == 6
    for key in a:
        assert a[key][0] == b[key][0] == "ok"
        assert a[key][1] == pytest.approx(b[key][1], rel=1e-6), key  # measured 1.1e-8
        assert a[key][2] == pytest.approx(b[key][2], abs=LOSS_TOL + 1e-5), key  # records round it to 5 decimals
    assert "x2 (DDP 2 processes, gloo)" in data["run"]["device"]
    files = sorted(p.relative_to(out0).as_posix() for p in out0.rglob("*"))
    assert files == sorted(p.relative_to(tmp_path / "single").as_posix() for p in (tmp_path / "single").rglob("*"))


@pytest.mark.slow
def test_torchrun_starts_the_cli(tmp_path):
    """`torchrun --nproc-per-node 2 -m posenc_bench run ...`, as a user types it."""
    out = tmp_path / "out"
    args = ["--config", "configs/ci.yaml", "--seeds", "1", "--encodings", "alibi", "--train-len", "16", "--steps", "4",
            "--batch-size", "8", "--d-model", "32", "--n-layers", "1", "--eval-tokens", "256", "--eval-lens", "1x",
            "--device", "cpu", "--threads", "1", "--progress", "off", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_free_port()),
         "-m", "posenc_bench", "run", *args],
        capture_output=True, text=True, timeout=300, env=env, cwd=Path(__file__).resolve().parents[3],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("posenc-bench run:") == 1  # rank 1 prints nothing
    data = json.loads((out / "results.json").read_text())
    assert [r["status"] for r in data["records"]] == ["ok"]
    assert "DDP 2 processes, gloo" in data["run"]["device"]
