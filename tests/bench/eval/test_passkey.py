"""Passkey retrieval: prompts of exact length with the key at the asked depth; scoring; effective context."""

import json
import re

import pytest
import torch

from posenc_bench.bench.eval import passkey
from posenc_bench.commands.cli import main
from posenc_bench.errors import PositionOutOfRange


class ByteOracle:
    """Retrieves the key perfectly if the needle is within its last ``sight`` tokens, else guesses '0'."""

    name = "oracle"
    train_len = 256

    def __init__(self, sight=10**9, max_len=10**9):
        self.sight, self.max_len = sight, max_len

    def encode(self, text):
        return list(text.encode())

    def prefix(self):
        return [256]

    def set_length(self, length):
        if length > self.max_len:
            raise PositionOutOfRange(f"table has {self.max_len} rows")

    def logits(self, ids):
        ids = ids[0].tolist()
        out = torch.zeros(len(ids), 257)
        for i in range(len(ids)):
            seen = bytes(t for t in ids[max(0, i + 1 - self.sight) : i + 1] if t < 256).decode()
            m = re.search(r"The pass key is (\d{5})\.", seen)
            q = seen.rfind("What is the pass key? The pass key is")
            guess = ord("0")
            if m and q >= 0:
                answer = " " + m.group(1)
                done = seen[q + len("What is the pass key? The pass key is"):]
                if answer.startswith(done) and len(done) < len(answer):
                    guess = ord(answer[len(done)])
            out[i, guess] = 1.0
        return out


@pytest.mark.parametrize("depth", [0.0, 0.3, 1.0])
def test_prompt_is_exactly_the_length_with_the_key_at_the_depth(depth):
    lm = ByteOracle()
    p = passkey.build_prompt(lm, 600, depth, "12345")
    assert len(p.ids) == 600 and p.ids[0] == 256
    text = bytes(p.ids[1:]).decode()
    assert text.startswith(passkey.INTRO) and text.endswith("What is the pass key? The pass key is 12345")
    assert bytes(p.ids[p.answer_start:]).decode() == " 12345"
    needle = text.index(" The pass key is 12345.")
    filler = 600 - 1 - len(passkey.INTRO) - len(passkey.NEEDLE.format(key="12345")) - len(passkey.QUESTION) - 6
    assert p.needle_at == 1 + needle == 1 + len(passkey.INTRO) + round(depth * filler)


def test_scoring_and_effective_context():
    result = passkey.passkey_sweep(ByteOracle(), [256, 512], trials=3, log=lambda s: None)
    assert {r["accuracy"] for r in result["records"]} == {1.0} and result["effective_context"] == 512
    # sees only the last 300 tokens: the needle near the start of a 512-token prompt is out of sight
    short = passkey.passkey_sweep(ByteOracle(sight=300), [256, 512], trials=2, log=lambda s: None)
    acc = {(r["length"], r["depth"]): r["accuracy"] for r in short["records"]}
    assert acc[256, 0.0] == 1.0 and acc[512, 0.0] == 0.0 and acc[512, 1.0] == 1.0
    assert short["effective_context"] == 256
    table = [[c.strip() for c in line.strip("|").split("|")] for line in passkey.markdown(short).splitlines()
             if line.startswith("| ")]
    assert table[0] == ["depth", "1x (256)", "2x (512)"] and table[1] == ["0", "2/2", "0/2"]
    limited = passkey.passkey_sweep(ByteOracle(max_len=300), [256, 512], trials=1, log=lambda s: None)
    assert [r["status"] for r in limited["records"] if r["length"] == 512] == ["n/a"] * 5
    assert limited["effective_context"] == 256
    again = passkey.passkey_sweep(ByteOracle(sight=300), [256, 512], trials=2, log=lambda s: None)
    assert again == short  # the same keys every time


def test_bad_depth_and_too_short_prompts_are_clear_errors():
    from posenc_bench.errors import ConfigError

    with pytest.raises(ConfigError, match="depth 1.5 is outside"):
        passkey.passkey_sweep(ByteOracle(), [256], [1.5])
    with pytest.raises(ConfigError, match="passkey length 64 is too short"):
        passkey.build_prompt(ByteOracle(), 64, 0.5, "12345")


def test_passkey_cli_on_a_trained_checkpoint(tmp_path, capsys):
    run = ["run", "--config", "configs/ci.yaml", "--seeds", "1", "--encodings", "rope,learned", "--train-len", "256",
           "--steps", "2", "--eval-tokens", "600", "--set", "eval.lens=[1x]", "--out", str(tmp_path / "r"),
           "--progress", "off"]
    assert main(run) == 0
    ckpt = tmp_path / "r" / "checkpoints"
    assert main(["passkey", "--model", str(ckpt / "rope-seed0"), "--lengths", "1,2x", "--trials", "1",
                 "--encoding", "rope-yarn", "--out", str(tmp_path / "pk")]) == 0
    data = json.loads((tmp_path / "pk" / "passkey.json").read_text())
    assert data["train_len"] == 256 and {r["length"] for r in data["records"]} == {256, 512}
    assert data["checkpoint"]["encoding"] == "rope-yarn" and len(data["records"]) == 10
    assert data["device"].startswith("cpu:") and data["git_commit"] and data["versions"]["torch"]  # where it ran
    assert all(r["status"] == "ok" and r["trials"] == 1 for r in data["records"])
    assert "Effective context" in (tmp_path / "pk" / "passkey.md").read_text()
    assert main(["passkey", "--model", str(ckpt / "learned-seed0"), "--lengths", "1,2x", "--trials", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\| 0 +\| +0/1 \| +n/a \|", out) and "none of the lengths tried" in out
    assert main(["passkey", "--model", str(ckpt / "rope-seed0"), "--encoding", "alibi"]) == 2
    assert "does not evaluate the trained 'rope' model" in capsys.readouterr().err


def test_passkey_on_a_hugging_face_model_with_its_tokenizer_and_a_scaling(llama_dir, tmp_path):
    from posenc_bench.bench.eval import passkey

    lm = passkey.load_lm(f"hf:{llama_dir}", rope_scaling="yarn")
    assert lm.train_len == 32
    assert lm.prefix() == []  # this tokenizer adds no special tokens (no post-processor)
    lm.hf.tokenizer._tokenizer.post_processor = __import__("tokenizers").processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 1)])
    assert lm.prefix() == [0]  # BOS before the text counts; EOS after it does not
    lm.hf.tokenizer._tokenizer.post_processor = None
    original = lm.hf.rotary_modules()[0].inv_freq.clone()
    lm.set_length(64)  # factor 2: transformers' yarn frequencies inside, the original module put back after
    scaled = lm.hf.rotary_modules()[0]
    assert scaled.rope_type == "yarn" and not torch.equal(scaled.inv_freq, original)
    p = passkey.build_prompt(lm, 200, 0.5, "12345")
    assert len(p.ids) == 200 and "12345" in lm.hf.tokenizer.decode(p.ids[p.answer_start:])
    lm.set_length(32)
    assert torch.equal(lm.hf.rotary_modules()[0].inv_freq, original)
    out = tmp_path / "pk"
    assert main(["passkey", "--model", f"hf:{llama_dir}", "--rope-scaling", "yarn", "--lengths", "8,16x",
                 "--trials", "1", "--depths", "0,1", "--out", str(out)]) == 0
    data = json.loads((out / "passkey.json").read_text())
    assert data["model"] == "hf:tiny-llama+yarn" and {r["length"] for r in data["records"]} == {256, 512}
    assert data["checkpoint"]["model"]["class"] == "LlamaForCausalLM"
    assert main(["passkey", "--model", f"hf:{llama_dir}", "--encoding", "rope-yarn"]) == 2


def test_passkey_records_come_from_the_record_builder_with_the_fields_they_always_had():
    """records.passkey_record is the one builder; passkey.json's records keep their fields, values and order
    (the old inline dicts, below, are the reference)."""
    import random

    def old(L, d, status, reason, keys=None):
        if status == "n/a":
            return {"length": L, "ratio": L / 256, "depth": d, "status": "n/a", "reason": reason, "trials": 0,
                    "correct": 0, "accuracy": None}
        return {"length": L, "ratio": L / 256, "depth": d, "status": "ok", "reason": "", "trials": 2,
                "correct": 2, "accuracy": 1.0, "keys": keys}

    result = passkey.passkey_sweep(ByteOracle(max_len=300), [256, 512], [0.0, 1.0], trials=2, log=lambda s: None)
    rng = {d: random.Random(f"0:256:{d}") for d in (0.0, 1.0)}
    expected = [old(256, d, "ok", "", [str(rng[d].randint(10000, 99999)) for _ in range(2)]) for d in (0.0, 1.0)]
    expected += [old(512, d, "n/a", "table has 300 rows") for d in (0.0, 1.0)]
    assert json.dumps(result["records"]) == json.dumps(expected)


# a micro run of the -ft rows (tests/bench/config/test_finetune.py: their plan)
FT_MICRO = ["--config", "configs/ci.yaml", "--seeds", "1", "--train-len", "16", "--steps", "20", "--eval-tokens", "512",
            "--eval-lens", "1,2,4x", "--progress", "off"]


def test_passkey_runs_a_fine_tuned_checkpoint_at_its_tuned_scaling(tmp_path):
    from posenc_bench.bench.eval.passkey import CheckpointLM
    from posenc_bench.errors import ConfigError

    out = tmp_path / "out"
    assert main(["run", *FT_MICRO, "--train-len", "256", "--steps", "2", "--eval-lens", "1,2x", "--encodings",
                 "rope-linear-ft", "--out", str(out)]) == 0
    lm = CheckpointLM(out / "checkpoints" / "rope-linear-ft-seed0")
    assert lm.model.encoding.tuned_len == 512 and lm.model.encoding.scale_for(256) == 2.0
    with pytest.raises(ConfigError, match="is fine-tuned: give its own checkpoint"):
        CheckpointLM(out / "checkpoints" / "rope-seed0", encoding="rope-linear-ft")
