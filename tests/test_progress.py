"""Progress bars and log lines (progress.py): bars only on a terminal unless asked, log lines on stdout above them."""

import sys

from posenc_bench.progress import progress_bar, say


def shown(enabled):
    """Whether a bar made with ``enabled`` draws (tqdm disables every bar once it is closed)."""
    bar = progress_bar(3, "training", enabled)
    for _ in range(3):
        bar.update(1)
    drawn = not bar.disable
    bar.close()
    return drawn


def test_bars_are_quiet_off_a_terminal(capsys):
    assert not sys.stderr.isatty()  # pytest's capture: stderr is not a terminal
    assert not shown(None) and not shown(False)
    assert capsys.readouterr() == ("", "")
    assert shown(True)  # asked for: drawn even here, so the quiet above is the terminal check's
    assert "training" in capsys.readouterr().err


def test_on_a_terminal_bars_show_unless_turned_off(capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert shown(None) and not shown(False)
    assert "training" in capsys.readouterr().err


def test_say_prints_a_line_on_stdout_even_with_a_bar_on_screen(capsys):
    say("rope seed 0: trained 8 steps")
    bar = progress_bar(3, "training", True)
    say("rope seed 1: done before, skipped")
    bar.close()
    out, err = capsys.readouterr()
    assert out == "rope seed 0: trained 8 steps\nrope seed 1: done before, skipped\n" and "training" in err
