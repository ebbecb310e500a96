"""`posenc-bench eval`: its flags checked before any model is looked for."""

from posenc_bench.commands.cli import main


def test_eval_precision_fp8_is_one_line_naming_the_valid_ones(tmp_path, capsys):
    # checked before the model is looked for: this folder does not exist either
    assert main(["eval", "--model", "hf:/no/such/folder", "--precision", "fp8", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err == "posenc-bench eval: error: precision 'fp8' is not supported here; valid: fp32, bf16, fp16\n"
    assert not (tmp_path / "o").exists()
