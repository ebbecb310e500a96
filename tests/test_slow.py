"""Longer end-to-end check (marker "slow", about a minute): the CI config reproduces the known picture."""

import json

import pytest

from posenc_bench.commands.cli import main


@pytest.mark.slow
def test_ci_config_shows_the_known_extrapolation_picture(tmp_path):
    assert main(["run", "--config", "configs/ci.yaml", "--seeds", "1", "--out", str(tmp_path), "--progress", "off"]) == 0
    recs = json.loads((tmp_path / "results.json").read_text())["records"]
    ppl = {(r["encoding"], r["ratio"]): r["ppl"] for r in recs if r["status"] == "ok"}
    ratio4 = {e: ppl[(e, 4.0)] / ppl[(e, 1.0)] for e in ("sinusoidal", "rope", "rope-linear", "alibi", "t5", "nope")}
    assert ratio4["alibi"] < 1.05  # ALiBi holds up
    assert ratio4["rope"] > ratio4["alibi"] + 0.1  # plain RoPE degrades past the train length
    assert ratio4["rope-linear"] > ratio4["rope"]  # zero-shot interpolation is worse than raw RoPE here
    assert ratio4["sinusoidal"] > 1.2  # absolute sinusoids fall apart
    assert ppl[("rope", 1.0)] < ppl[("nope", 1.0)]  # position information helps at 1x
    assert {r["status"] for r in recs if r["encoding"] == "learned" and r["ratio"] > 1} == {"n/a"}
