"""posenc-bench command line: thin wrappers that parse, call the library, print. Errors -> one line, exit 2.

One module per command (``posenc_bench/commands/<name>.py``), each with ``add_parser(sub)`` (its flags) and
``cmd(args)``; this module builds the parser from them, runs one, and holds the argument helpers they share.
Nothing here imports torch or the library at parser-build time: each command imports what it calls.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

from posenc_bench.errors import PosencError

USAGE_ERROR = 2
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
TERMINATED = 143  # 128 + SIGTERM

# In the order `posenc-bench --help` lists them.
COMMANDS = ("run", "report", "plot", "gate", "passkey", "needles", "merge", "documents", "eval", "time", "list", "configs")

DEVICES_HELP = "auto (default: cuda if available, else cpu) | cpu | cuda | cuda:N"


class ConfigDefault(str):
    """A parser default that defers to the config file: a value the user did not type (see ``given``)."""


def given(value: Any) -> bool:
    """Whether a flag's value came from the command line (not None, not a ``ConfigDefault``)."""
    return value is not None and not isinstance(value, ConfigDefault)


class LazyChoices:
    """argparse ``choices`` read from the library only when needed (the flag given, or --help): importing
    the table that holds them may import torch, which building the parser for `report` should not. Give the
    argument a ``metavar`` (argparse formats the choices into one otherwise, at add_argument) and write
    ``%(choices)s`` in its help."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def _values(self) -> tuple:
        return tuple(getattr(importlib.import_module(self.module), self.name))

    def __contains__(self, value: object) -> bool:
        return value in self._values()

    def __iter__(self):
        return iter(self._values())


def add_device(p: argparse.ArgumentParser, *, defer_to_config: bool = False) -> None:
    """``--device``, default auto in every command; with ``defer_to_config`` the config file's device wins
    unless the flag is given."""
    if defer_to_config:
        p.add_argument("--device", default=ConfigDefault("auto"),
                       help="auto | cpu | cuda | cuda:N (default: the config's device, auto unless it sets one)")
    else:
        p.add_argument("--device", default="auto", help=DEVICES_HELP)


def add_precision(p: argparse.ArgumentParser, valid: tuple[str, ...], *, default: Optional[str] = None,
                  what: str = "") -> None:
    """``--precision``, spelled the same in every command; the help lists the valid values."""
    shown = f"; default {default}" if default else ""
    p.add_argument("--precision", default=default, help=f"{' | '.join(valid)}{shown}{what}")


def check_precision(name: Optional[str], valid: tuple[str, ...]) -> Optional[str]:
    """``name`` if it is one of ``valid`` (or None); otherwise the ConfigError naming the valid ones."""
    if name is not None:
        from posenc_bench.env import precision_dtype

        precision_dtype(name, valid)
    return name


def add_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--progress", choices=("auto", "on", "off"), default="auto")


def progress_choice(args: argparse.Namespace) -> Optional[bool]:
    """--progress auto -> None (bars when stderr is a terminal), on -> True, off -> False."""
    return None if args.progress == "auto" else args.progress == "on"


def split_commas(value: str) -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c']."""
    return [v.strip() for v in value.split(",") if v.strip()]


def parse_set(items: Optional[list[str]], example: str) -> dict[str, Any]:
    """``--set KEY=VALUE`` (repeatable) -> {KEY: VALUE parsed as YAML}; ``example`` is shown on a bad item."""
    import yaml

    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise PosencError(f"--set {item!r}: expected KEY=VALUE, e.g. --set {example}")
        out[key.strip()] = yaml.safe_load(value)
    return out


class UsageError(PosencError):
    """A command line argparse cannot parse (an unknown flag, a missing value, a bad choice): ``main`` prints
    it as one line, ``<prog>: error: <argparse's message>``, and returns 2, without argparse's usage dump."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """The parser of posenc-bench and (argparse makes them of the same class) of each command: a usage error is
    raised as :class:`UsageError` instead of printing the usage and exiting; ``--help`` prints as argparse does."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(self.prog, message)


@contextlib.contextmanager
def writing(path: Path | str) -> Iterator[None]:
    """Turn an OSError while writing ``path`` (a read-only folder, a file where a folder should be, a full disk)
    into the PosencError ``cannot write '<path>': <reason>``."""
    try:
        yield
    except OSError as e:
        raise PosencError(cannot_write(path, e)) from None


def cannot_write(path: Path | str, e: OSError) -> str:
    """``cannot write '<path>': <reason>``; the part of the path that failed when it is not ``path`` itself."""
    reason = e.strerror or str(e)
    if isinstance(e, FileExistsError) and e.filename is not None:
        reason = f"{e.filename!r} is a file, not a folder"
    elif e.filename is not None and str(e.filename) != str(path):
        reason += f" ({e.filename!r})"
    return f"cannot write {str(path)!r}: {reason}"


def values_not_options(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``["--opt", "-value"]`` -> ``["--opt=-value"]`` where ``--opt`` is an option of the chosen command that
    takes one value and ``-value`` is none of its options, so that ``--eval-lens -2x``, ``--rows -rope`` and
    ``--encodings -learned`` give the option its value (argparse reads a value that begins with '-' as an
    option and fails with its usage)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = next((i for i, a in enumerate(argv) if a in sub.choices), None)
    if command is None:
        return argv
    options = sub.choices[argv[command]]._option_string_actions
    longs = [o for o in options if o.startswith("--")]
    out, i = list(argv[:command + 1]), command + 1
    while i < len(argv):
        token, value = argv[i], argv[i + 1] if i + 1 < len(argv) else None
        if token == "--":
            return out + argv[i:]
        if (token in options and options[token].nargs is None and value is not None and value.startswith("-")
                and value != "--" and not _is_option(value, options, longs)):
            out.append(f"{token}={value}")
            i += 2
        else:
            out.append(token)
            i += 1
    return out


def _is_option(value: str, options: dict, longs: list[str]) -> bool:
    """Whether argparse would read ``value`` as one of ``options`` (exactly, as --opt=x, or abbreviated)."""
    name = value.split("=", 1)[0]
    return name in options or (name.startswith("--") and any(o.startswith(name) for o in longs))


def build_parser() -> argparse.ArgumentParser:
    from posenc_bench import __version__

    p = Parser(prog="posenc-bench", description="Benchmark length extrapolation of positional encodings.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"posenc_bench.commands.{name}")
        module.add_parser(sub).set_defaults(func=module.cmd)
    return p


class Terminated(KeyboardInterrupt):
    """SIGTERM (a CI timeout, a scheduler's kill) raised where the process is, so that it unwinds as Ctrl-C
    does: every results folder's lock and owner file released, and the same line saying how to resume."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args, unknown = parser.parse_known_args(values_not_options(parser, argv))
        if unknown:  # argparse would name the top-level parser; the command's own is the one to name
            raise UsageError(f"posenc-bench {args.command}", f"unrecognized arguments: {' '.join(unknown)}")
    except UsageError as e:
        print(f"{e.prog}: error: {e}", file=sys.stderr)
        return USAGE_ERROR
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread: leave the signal alone
        previous = None
    try:
        return args.func(args)
    except PosencError as e:
        print(f"posenc-bench {args.command}: error: {e}", file=sys.stderr)
        return USAGE_ERROR
    except OSError as e:  # a file the command could not write or read, not named by the command (see ``writing``)
        where = f" {str(e.filename)!r}" if e.filename is not None else ""
        print(f"posenc-bench {args.command}: error: cannot read or write{where}: {e.strerror or e}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt as e:
        what, code = ("terminated (SIGTERM)", TERMINATED) if isinstance(e, Terminated) else ("interrupted", INTERRUPTED)
        print(f"posenc-bench {args.command}: {what}; rerun the same command to resume", file=sys.stderr)
        return code
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
