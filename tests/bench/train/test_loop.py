import math

import pytest
import torch

from posenc_bench.bench.config import TrainConfig
from posenc_bench.data import TrainBatches
from posenc_bench.model.transformer import DecoderLM, ModelConfig
from posenc_bench.bench.train.loop import Resume, lr_at, train
from posenc_bench.bench.run.runtime import Runtime


def test_schedule_warms_up_then_decays_to_the_floor():
    kw = dict(lr=1.0, warmup=10, total=110, min_ratio=0.1)
    assert lr_at(0, **kw) == pytest.approx(0.1)
    assert lr_at(9, **kw) == pytest.approx(1.0)
    assert lr_at(60, **kw) == pytest.approx(0.55)
    assert lr_at(110, **kw) == pytest.approx(0.1)
    assert all(lr_at(s, **kw) >= lr_at(s + 1, **kw) for s in range(10, 120))


def _stream():
    g = torch.Generator().manual_seed(0)
    # a learnable stream: a repeating pattern with noise
    base = torch.arange(20000) % 37
    return torch.where(torch.rand(20000, generator=g) < 0.1, torch.randint(0, 256, (20000,), generator=g), base).to(torch.int16)


def _run(encoding="rope", **overrides):
    cfg = TrainConfig(train_len=16, batch_size=8, steps=30, lr=3e-3, warmup_steps=5, log_every=10)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    model = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=2), encoding, 16, seed=0)
    out = train(model, TrainBatches(_stream(), 16, 8, seed=0), cfg, Runtime(torch.device("cpu"), show_progress=False))
    return model, out


def test_training_learns_and_is_deterministic():
    m1, a = _run()
    m2, b = _run()
    assert a.status == "ok" and a.steps == 30
    assert a.curve == b.curve
    assert all(torch.equal(p, q) for p, q in zip(m1.state_dict().values(), m2.state_dict().values()))
    assert a.curve[-1][1] < a.curve[0][1] - 0.5
    assert a.tokens_per_s > 0


def test_divergence_is_recorded_with_the_last_finite_loss():
    _, out = _run(lr=50.0, warmup_steps=1, grad_clip=1e9)
    assert out.status == "diverged"
    assert out.final_loss is None
    assert out.last_finite_loss is not None and math.isfinite(out.last_finite_loss)
    assert "diverged at step" in out.reason and "last finite loss" in out.reason


def test_bf16_autocast_path_runs_on_cpu():
    cfg = TrainConfig(train_len=16, batch_size=4, steps=3, warmup_steps=1, log_every=1)
    model = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=2), "alibi", 16)
    out = train(model, TrainBatches(_stream(), 16, 4, 0), cfg,
                Runtime(torch.device("cpu"), torch.bfloat16, show_progress=False))
    assert out.status == "ok" and len(out.curve) == 3


def test_interrupted_training_resumes_to_the_uninterrupted_result(tmp_path):
    cfg = TrainConfig(train_len=16, batch_size=8, steps=30, lr=3e-3, warmup_steps=5, log_every=4)
    model_cfg = ModelConfig(d_model=32, n_layers=1, n_heads=2)
    state = tmp_path / "train_state.pt"

    ref_model = DecoderLM(model_cfg, "t5", 16, seed=0)
    ref = train(ref_model, TrainBatches(_stream(), 16, 8, seed=0), cfg, Runtime(torch.device("cpu"), show_progress=False))

    class Interrupt(Exception):
        pass

    batches = TrainBatches(_stream(), 16, 8, seed=0)
    real_next, calls = batches.next, []

    def next_or_stop():
        calls.append(1)
        if len(calls) == 23:  # interrupted in step 22, after the save at step 20
            raise Interrupt
        return real_next()

    batches.next = next_or_stop
    with pytest.raises(Interrupt):
        train(DecoderLM(model_cfg, "t5", 16, seed=0), batches, cfg, Runtime(torch.device("cpu"), show_progress=False),
              resume=Resume(state, 10, "k"))
    assert torch.load(state, weights_only=True)["step"] == 20

    logs = []
    model = DecoderLM(model_cfg, "t5", 16, seed=0)
    out = train(model, TrainBatches(_stream(), 16, 8, seed=0), cfg, Runtime(torch.device("cpu"), show_progress=False, log=logs.append),
                resume=Resume(state, 10, "k"))
    assert logs and "resuming from step 20" in logs[0]
    assert out.curve == ref.curve and out.status == "ok"
    for (name, p), q in zip(model.state_dict().items(), ref_model.state_dict().values()):
        assert torch.equal(p, q), name

    # a state saved under another key (another config) is ignored
    logs.clear()
    train(DecoderLM(model_cfg, "t5", 16, seed=0), TrainBatches(_stream(), 16, 8, seed=0), cfg,
          Runtime(torch.device("cpu"), show_progress=False, log=logs.append), resume=Resume(state, 0, "other"))
    assert logs == []


class _FakeClock:
    """A clock each training step moves by ``step_s`` seconds (it moves when the step draws its batch)."""

    def __init__(self, batches: TrainBatches, step_s: float) -> None:
        self.t, real_next = 0.0, batches.next

        def next_and_tick():
            self.t += step_s
            return real_next()

        batches.next = next_and_tick

    def __call__(self) -> float:
        return self.t


def _saves(tmp_path, steps, resume_of, stop_after=None):
    """The steps at which a training of ``steps`` steps saved its state (each step 200 s by a fake clock);
    with ``stop_after``, killed (an exception) right after that step."""
    cfg = TrainConfig(train_len=16, batch_size=4, steps=steps, warmup_steps=1, log_every=1)
    batches = TrainBatches(_stream(), 16, 4, seed=0)
    resume = resume_of(_FakeClock(batches, 200.0))
    saved, done = [], []
    real = torch.save

    def save(state, path, *a, **k):
        saved.append(state["step"])
        return real(state, path, *a, **k)

    def on_step():
        done.append(1)
        if len(done) == stop_after:
            raise KeyboardInterrupt

    torch.save, model = save, DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=2), "rope", 16, seed=0)
    try:
        train(model, batches, cfg, Runtime(torch.device("cpu"), show_progress=False), resume=resume, on_step=on_step)
    finally:
        torch.save = real
    return saved


def test_a_state_is_saved_by_time_as_well_as_by_steps(tmp_path):
    """At 200 s a step and save_every_s 600, a state every 3 steps although save_every (100) is never reached;
    a run killed after step 4 resumes from step 3. save_every_s 0: steps only."""
    state = tmp_path / "train_state.pt"
    assert _saves(tmp_path, 10, lambda clock: Resume(state, 100, "k", 600.0, clock)) == [3, 6, 9]
    state.unlink()
    with pytest.raises(KeyboardInterrupt):
        _saves(tmp_path, 10, lambda clock: Resume(state, 100, "k", 600.0, clock), stop_after=4)
    saved = torch.load(state, weights_only=True)
    assert saved["step"] == 3 and set(saved) == {"key", "step", "model", "optimizer", "generator", "curve", "first_loss",
                                                 "last_finite", "window_sum", "window_n", "elapsed", "above"}
    del saved["above"]  # a state saved before the divergence rule counted windows resumes with none above
    torch.save(saved, state)
    logs = []
    cfg = TrainConfig(train_len=16, batch_size=4, steps=10, warmup_steps=1, log_every=1)
    train(DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=2), "rope", 16, seed=0),
          TrainBatches(_stream(), 16, 4, seed=0), cfg, Runtime(torch.device("cpu"), show_progress=False, log=logs.append),
          resume=Resume(state, 100, "k", 600.0))
    assert "resuming from step 3 of 10" in logs[0]
    state.unlink()
    assert _saves(tmp_path, 10, lambda clock: Resume(state, 4, "k", 0.0, clock)) == [4, 8]  # 0: by steps only
    state.unlink()
    assert _saves(tmp_path, 10, lambda clock: Resume(state, 4, "k", 500.0, clock)) == [3, 4, 7, 8]  # whichever first


def test_save_every_s_is_a_run_setting_that_changes_no_identity():
    from posenc_bench.bench.config import RunConfig, load_config
    from posenc_bench.bench.records import NOT_IDENTITY

    assert RunConfig().save_every_s == 600.0 and "config.save_every_s" in NOT_IDENTITY
    with pytest.raises(ValueError, match=r"save_every_s must be >= 0 seconds \(0 = by steps only\), got -1"):
        load_config("ci", {"save_every_s": -1})


def _per_step_reference(values, cfg):
    """What the loop reports when it reads every step's loss at once: (status, steps, last finite, reason,
    curve). A loss that is not finite ends the run at its step; at each log step, the window's mean loss above
    factor x the first loss in ``patience`` windows in a row, or in the last window, ends it there."""
    first, last, total, n, curve, above = None, None, 0.0, 0, [], 0
    for step, value in enumerate(values):
        first = value if first is None else first
        if not math.isfinite(value):
            reason = (f"diverged at step {step}: loss became {value} (first loss {first:.4g}, "
                      f"last finite loss {last if last is None else round(last, 4)})")
            return "diverged", step, last, reason, curve
        last, total, n = value, total + value, n + 1
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            above = above + 1 if total / n > cfg.divergence_factor * first else 0
            if above >= cfg.divergence_patience or (above and step + 1 == cfg.steps):
                windows = f"{above} logged windows in a row" if above > 1 else "the last logged window"
                reason = (f"diverged at step {step + 1}: mean loss {total / n:.4g} over {windows} above "
                          f"{cfg.divergence_factor:g} x the first loss {first:.4g} (last finite loss {round(last, 4)})")
                return "diverged", step + 1, last, reason, curve
            curve.append([step + 1, round(total / n, 5)])
            total, n = 0.0, 0
    return "ok", cfg.steps, last, "", curve


def _recorded_run(monkeypatch, resume=Resume(), **overrides):
    """A run of ``_run``'s model with every step's loss recorded as it was computed (read in the wrapper)."""
    from posenc_bench.bench.train import loop

    values, real = [], loop._loss_and_grads
    monkeypatch.setattr(loop, "_loss_and_grads", lambda *a, **k: values.append(real(*a, **k).item()) or
                        torch.tensor(values[-1], dtype=torch.float32))
    cfg = TrainConfig(train_len=16, batch_size=8, steps=30, lr=3e-3, warmup_steps=5, log_every=7)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    model = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=2), "rope", 16, seed=0)
    out = train(model, TrainBatches(_stream(), 16, 8, seed=0), cfg, Runtime(torch.device("cpu"), show_progress=False),
                resume=resume)
    return out, values, cfg


def test_the_curve_read_at_log_time_is_the_per_step_one_bit_for_bit(monkeypatch):
    out, values, cfg = _recorded_run(monkeypatch)
    status, steps, last, reason, curve = _per_step_reference(values, cfg)
    assert len(values) == 30 and status == "ok" and len(curve) == 5  # 7, 14, 21, 28 and the last step, 30
    assert out.curve == curve and out.last_finite_loss == last and out.final_loss == curve[-1][1]


@pytest.mark.parametrize("save_every", [0, 1])
def test_divergence_read_at_log_time_names_the_first_diverging_step(monkeypatch, tmp_path, save_every):
    """The step, reason and last finite loss of the first step that diverged, though its loss is read at the next
    log step; saving every step reads the losses early and never saves a state past the diverged step."""
    resume = Resume(tmp_path / "state.pt", save_every, "k")
    out, values, cfg = _recorded_run(monkeypatch, resume, lr=50.0, warmup_steps=1, grad_clip=1e9, log_every=10)
    status, steps, last, reason, curve = _per_step_reference(values, cfg)
    assert status == "diverged"
    assert (out.status, out.steps, out.last_finite_loss, out.reason, out.curve) == (status, steps, last, reason, curve)
    if "became" in reason:  # a loss that is not finite, read at the next log step: it ran on to there
        assert steps % cfg.log_every != cfg.log_every - 1 and len(values) == (steps // cfg.log_every + 1) * cfg.log_every
    else:  # judged at a log step, after the windows that made it
        assert len(values) == steps and steps % cfg.log_every == 0
    if save_every:
        assert torch.load(resume.path, weights_only=True)["step"] == steps  # the last state before the diverged step


def test_a_step_reads_nothing_from_the_device_but_the_first_loss(monkeypatch):
    """One .item() (the first loss: the divergence threshold) and one read of the losses per log interval, of
    the package's own reads (torch's CPU AdamW reads its step counters, on the host: those are not counted)."""
    import sys

    counts = {"item": 0, "tolist": 0}
    for name in counts:
        real = getattr(torch.Tensor, name)

        def counted(self, *a, _real=real, _name=name, **k):
            counts[_name] += "posenc_bench" in sys._getframe(1).f_code.co_filename
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    _, out = _run(steps=20, log_every=5)
    assert out.status == "ok" and counts == {"item": 1, "tolist": 4}



def test_fused_adamw_on_cuda_only():
    from posenc_bench.bench.train.loop import make_optimizer

    model = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=2), "rope", 16)
    opt = make_optimizer(model, TrainConfig())
    assert not opt.defaults.get("fused")  # the CPU keeps the default implementation
    if torch.cuda.is_available():
        assert make_optimizer(model.cuda(), TrainConfig()).defaults["fused"] is True


@pytest.mark.slow  # compiling the block takes several seconds
def test_compiled_training_follows_the_eager_curve_and_leaves_the_model_eager():
    m, compiled = _run("nope", steps=6, log_every=3, compile=True)
    _, eager = _run("nope", steps=6, log_every=3)
    assert compiled.status == eager.status == "ok" and m._compiled is None  # eager again after training
    assert [s for s, _ in compiled.curve] == [3, 6]
    assert all(abs(a[1] - b[1]) < 1e-4 for a, b in zip(compiled.curve, eager.curve))


def _scripted_run(monkeypatch, losses, **overrides):
    """A run whose steps report ``losses`` (one a step, no gradients: the optimizer skips the step)."""
    from posenc_bench.bench.train import loop

    script = iter(losses)
    monkeypatch.setattr(loop, "_loss_and_grads", lambda *a, **k: torch.tensor(next(script), dtype=torch.float32))
    cfg = TrainConfig(train_len=16, batch_size=8, steps=len(losses), warmup_steps=1, log_every=5)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    model = DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=2), "rope", 16, seed=0)
    out = train(model, TrainBatches(_stream(), 16, 8, seed=0), cfg, Runtime(torch.device("cpu"), show_progress=False))
    assert (out.status, out.steps, out.reason, out.curve) == _per_step_reference(losses, cfg)[0:2] + \
        _per_step_reference(losses, cfg)[3:]
    return out


def test_a_spike_that_training_recovers_from_is_not_a_divergence(monkeypatch):
    """One batch at 10x the first loss (the old rule's divergence) lifts one window's mean over 2x; the next
    windows are back under it, so the run is ok; two such windows apart are still ok."""
    losses = [5.0] * 5 + [3.0, 3.0, 50.0, 3.0, 3.0] + [3.0] * 10 + [3.0, 50.0, 3.0, 3.0, 3.0] + [2.5] * 5
    out = _scripted_run(monkeypatch, losses)
    assert out.status == "ok" and out.steps == 30 and out.curve[1] == [10, 12.4]


def test_a_loss_that_stays_above_the_threshold_diverges_after_patience_windows(monkeypatch):
    losses = [5.0] * 10 + [12.0] * 15 + [3.0] * 10
    out = _scripted_run(monkeypatch, losses)
    assert out.status == "diverged" and out.steps == 25 and out.final_loss is None
    assert out.reason == ("diverged at step 25: mean loss 12 over 3 logged windows in a row above 2 x the first "
                          "loss 5 (last finite loss 12.0)")
    assert out.curve == [[5, 5.0], [10, 5.0], [15, 12.0], [20, 12.0]]  # the curve up to the windows before it
    assert _scripted_run(monkeypatch, losses, divergence_patience=4).status == "ok"  # recovered in the 4th


def test_a_run_that_ends_above_the_threshold_failed(monkeypatch):
    out = _scripted_run(monkeypatch, [5.0] * 10 + [3.0] * 5 + [11.0] * 5)
    assert out.status == "diverged" and out.steps == 20
    assert "over the last logged window above 2 x the first loss 5" in out.reason


def test_a_loss_that_is_not_finite_diverges_at_its_step(monkeypatch):
    out = _scripted_run(monkeypatch, [5.0] * 7 + [float("nan")] + [5.0] * 7)
    assert out.status == "diverged" and out.steps == 7 and out.last_finite_loss == 5.0
    assert out.reason == "diverged at step 7: loss became nan (first loss 5, last finite loss 5.0)"


def test_divergence_patience_is_a_setting_of_at_least_one_window_and_no_part_of_a_key():
    from posenc_bench.bench.config import RunConfig, load_config
    from posenc_bench.bench.keys import train_ident
    from posenc_bench.bench.records import NOT_IDENTITY

    assert RunConfig().train.divergence_patience == 3 and "config.train.divergence_patience" in NOT_IDENTITY
    assert "divergence_patience" not in train_ident(RunConfig()) and "divergence_factor" in train_ident(RunConfig())
    with pytest.raises(ValueError, match=r"train.divergence_patience must be an integer >= 1 \(logged windows\), got 0"):
        load_config("ci", {"train.divergence_patience": 0})
    with pytest.raises(ValueError, match=r"train.divergence_patience must be int, got 1.5"):
        load_config("ci", {"train.divergence_patience": 1.5})
