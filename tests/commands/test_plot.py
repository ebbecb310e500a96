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


def test_minus_a_row_removes_that_row_and_its_windowed_rows_never_its_rand_row(tmp_path, monkeypatch):
    """'-rope' means the row rope (and rope+sw64, the same encoding with a window), never rope+rand or
    rope-yarn: the same for `plot --rows` on a results folder and for `run --encodings` over its rows."""
    from posenc_bench.analysis import plots
    from posenc_bench.commands.run import parse_encodings

    from tests.analysis import fake_results as fake

    rows = ["rope", "rope+rand", "rope+sw64", "rope-yarn", "alibi"]
    records = [fake.rec(r, 0, L, 4.0 + i + L / 100) for i, r in enumerate(rows) for L in (100, 200)]
    folder = fake.write(tmp_path / "res", fake.results(rows, records, seeds=(0,)))
    drawn = []
    real = plots.plot_ppl_vs_length
    monkeypatch.setattr(plots, "plot_ppl_vs_length", lambda runs, out, formats, chosen, *a: drawn.append(chosen)
                        or real(runs, out, formats, chosen, *a))
    monkeypatch.setattr(plots, "plot_loss_by_position", lambda run, out, formats, stem, rows: drawn.append(rows) or [])
    kept = ["rope+rand", "rope-yarn", "alibi"]
    for rows_flag in (["--rows=-rope"], ["--rows", "-rope"]):  # spaced, as a user types it: a value, not an option
        drawn.clear()
        assert main(["plot", str(folder), "--out", str(tmp_path / "f"), "--formats", "png", *rows_flag]) == 0
        assert drawn and all(chosen == kept for chosen in drawn)
    assert parse_encodings("-rope", rows) == kept
    assert parse_encodings("-rope+rand", rows) == ["rope", "rope+sw64", "rope-yarn", "alibi"]
