"""`posenc-bench report`: the formats, by flag or by the --out suffix, and README blocks."""

from posenc_bench.commands.cli import main


def test_report_format_markdown_is_md(tmp_path, capsys):
    from posenc_bench.analysis import report
    from posenc_bench.analysis.runs import load_runs

    folder = "results/default"  # committed
    assert main(["report", folder, "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert main(["report", folder, "--format", "markdown"]) == 0
    assert capsys.readouterr().out == md == report.render(load_runs([folder]), fmt="md")
    assert main(["report", folder, "--format", "markdown", "--out", str(tmp_path / "t.txt")]) == 0
    assert (tmp_path / "t.txt").read_text() == md
    readme = tmp_path / "README.md"
    readme.write_text(f"<!-- posenc-bench table: {folder} -->\n<!-- /posenc-bench table -->\n")
    assert main(["report", folder, "--format", "markdown", "--update", str(readme)]) == 0  # --update takes it too
    assert report.read_block(readme.read_text(), folder) == md
