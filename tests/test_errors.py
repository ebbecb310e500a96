"""Named errors (errors.py): where each sits among Python's own, so callers may catch either, and the CLI's promise
for every one of them: one line on stderr and exit code 2 (anything else is a bug and keeps its traceback)."""

import pytest

from posenc_bench.bench.checkpoint import CheckpointError
from posenc_bench.commands import list as list_command
from posenc_bench.commands.cli import main
from posenc_bench.errors import ConfigError, DataError, PosencError, PositionOutOfRange, UnknownEncodingError


def test_config_errors_are_value_errors_and_an_unknown_encoding_a_key_error_unquoted():
    assert issubclass(ConfigError, PosencError) and issubclass(ConfigError, ValueError)
    assert issubclass(UnknownEncodingError, ConfigError) and issubclass(UnknownEncodingError, KeyError)
    assert all(issubclass(e, PosencError) and not issubclass(e, ValueError) for e in (DataError, PositionOutOfRange))
    e = UnknownEncodingError("unknown encoding 'rotary'; valid encodings: rope, alibi")
    assert str(e) == "unknown encoding 'rotary'; valid encodings: rope, alibi"
    assert str(KeyError("x")) == "'x'"  # what KeyError alone would have printed
    with pytest.raises(KeyError, match="^unknown encoding 'rotary'"):
        raise e


@pytest.mark.parametrize("error", [PosencError, ConfigError, UnknownEncodingError, DataError, PositionOutOfRange,
                                   CheckpointError])
def test_the_cli_turns_each_into_one_line_and_exit_2(error, monkeypatch, capsys):
    def cmd(args):
        raise error("encoding 'x' is not a row; valid: rope, alibi")

    monkeypatch.setattr(list_command, "cmd", cmd)
    assert main(["list"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "posenc-bench list: error: encoding 'x' is not a row; valid: rope, alibi\n"


def test_an_error_that_is_not_ours_is_not_turned_into_a_line(monkeypatch):
    def cmd(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(list_command, "cmd", cmd)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["list"])
