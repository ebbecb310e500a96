"""`posenc-bench plot`: the figures of a committed folder, selected rows, and bad input as one line (the figures
themselves are tested in tests/analysis/test_plots.py)."""

from posenc_bench.commands.cli import main


def test_plot_draws_the_selected_rows_of_a_results_folder(tmp_path, capsys):
    assert main(["plot", "results/default", "--out", str(tmp_path), "--formats", "png", "--rows", "rope,alibi"]) == 0
    written = capsys.readouterr().out
    assert (tmp_path / "ppl_vs_length.png").is_file() and (tmp_path / "loss_by_position.png").is_file()
    assert f"wrote {tmp_path / 'ppl_vs_length.png'}" in written


def test_an_unknown_format_or_row_is_one_line(tmp_path, capsys):
    assert main(["plot", "results/default", "--out", str(tmp_path), "--formats", "gif"]) == 2
    assert capsys.readouterr().err == ("posenc-bench plot: error: unknown figure format(s) 'gif'; valid: png, svg\n")
    assert main(["plot", "results/default", "--out", str(tmp_path), "--rows", "ropey"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "row 'ropey' is not in the results; rows: sinusoidal, learned" in err
