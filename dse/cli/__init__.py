"""The ``dse`` command line: parse, load, call the library, format. No model logic here."""

from __future__ import annotations

import argparse
import importlib
import sys

from dse.errors import InputError

# Subcommand modules under dse.cli; each defines register(subparsers) that sets func.
COMMANDS = ["plan", "rankmap", "nccl_tests", "nccl_log", "check_log", "launch", "check", "suggest", "codesign",
            "validate", "calibrate", "sweep"]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        self.exit(2, f"dse: error: {message}\n")


def build_parser(only=None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of ``only`` (one module name): its imports alone."""
    parser = _Parser(prog="dse", description="Design-space explorer for large-model training plans.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMANDS if only is None else [only]:
        importlib.import_module(f"dse.cli.{name}").register(sub)
    return parser


def _command(argv) -> str | None:
    """The module of the subcommand ``argv`` starts with (``nccl-tests`` -> nccl_tests), if any."""
    name = argv[0].replace("-", "_") if argv else None
    return name if name in COMMANDS else None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command(argv))   # `dse plan` imports no sweep, co-design, optax or matplotlib
    args = parser.parse_args(argv)
    from dse.engines.compiled import enable_persistent_cache

    enable_persistent_cache()   # every command's compiled programs are reused by the next process
    try:
        return int(args.func(args) or 0)
    except InputError as exc:
        print(f"dse: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
