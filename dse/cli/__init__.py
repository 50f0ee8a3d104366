"""The ``dse`` command line: parse, load, call the library, format. No model logic here.

The contract at the top: bad input is one line on stderr naming the field and what is
allowed, exit 2; any other failure is one line naming the command (and the file it read),
exit 1, with ``--debug`` for the traceback; Ctrl-C is one line saying how to resume, exit 130.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

import numpy as np

from dse.errors import InputError

# Subcommand modules under dse.cli; each defines register(subparsers) that sets func.
COMMANDS = ["plan", "rankmap", "nccl_tests", "nccl_log", "check_log", "launch", "check", "suggest", "codesign",
            "validate", "calibrate", "sweep"]
# Arguments that name the file a command reads, for the one line of an unexpected error.
_FILE_ARGS = ("file", "runs", "log", "logs", "model_config", "calibration", "out")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        self.exit(2, f"dse: error: {message}\n")


def build_parser(only=None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of ``only`` (one module name): its imports alone."""
    parser = _Parser(prog="dse", description="Design-space explorer for large-model training plans.")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an unexpected error")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMANDS if only is None else [only]:
        importlib.import_module(f"dse.cli.{name}").register(sub)
    return parser


def _command(argv) -> str | None:
    """The module of the subcommand ``argv`` starts with (``nccl-tests`` -> nccl_tests), if any."""
    name = argv[0].replace("-", "_") if argv else None
    return name if name in COMMANDS else None


def _files(args) -> str:
    named = []
    for k in _FILE_ARGS:
        v = getattr(args, k, None)
        if isinstance(v, (list, tuple)):
            named += [str(x) for x in v]
        elif v:
            named.append(str(v))
    return f" (reading {', '.join(repr(n) for n in named)})" if named else ""


def _where(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    if not tb:
        return ""
    last = tb[-1]
    return f" at {os.path.basename(last.filename)}:{last.lineno}"


def _resume_hint(args) -> str:
    if getattr(args, "command", None) == "sweep" and getattr(args, "out", None):
        return (f"resume with: dse sweep {args.file} --out {args.out} --resume "
                f"(every finished chunk is saved in {args.out}/state.json)")
    return "nothing was left half-written; run the command again"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("DSE_DEBUG") == "1"
    if "--debug" in argv and argv.index("--debug") > 0:   # --debug anywhere, not only before the command
        argv.remove("--debug")
        argv.insert(0, "--debug")
    try:
        parser = build_parser(_command([a for a in argv if a != "--debug"]))   # `dse plan` imports no sweep, ...
        args = parser.parse_args(argv)
    except SystemExit as exc:   # argparse: --help (0) or a usage error (2, one line)
        return exc.code if isinstance(exc.code, int) else 2
    except KeyboardInterrupt:
        print("\ndse: interrupted before starting; nothing was written", file=sys.stderr)
        return 130
    command = f"dse {args.command.replace('_', '-')}"
    from dse.engines.compiled import enable_persistent_cache

    enable_persistent_cache()   # every command's compiled programs are reused by the next process
    try:
        with np.errstate(all="ignore"):   # numpy computes the equations here (dse/backend.py): no warnings, as in XLA
            return int(args.func(args) or 0)
    except InputError as exc:
        print(f"dse: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print(f"\n{command}: interrupted; {_resume_hint(args)}", file=sys.stderr)
        return 130
    except (IsADirectoryError, NotADirectoryError, PermissionError, FileNotFoundError, UnicodeDecodeError) as exc:
        if debug:
            traceback.print_exc()
        name = getattr(exc, "filename", None)
        what = f"{name!r}: " if name else ""
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not a UTF-8 text file"
        print(f"dse: error: {command}{_files(args) if not name else ''}: {what}{_one_line(why)}; "
              f"allowed: a readable text file", file=sys.stderr)
        return 2
    except SystemExit:
        raise
    except Exception as exc:   # a defect in dse: one line, the traceback with --debug
        if debug:
            traceback.print_exc()
        print(f"dse: internal error in {command}{_files(args)}: {type(exc).__name__}: {_one_line(exc)[:300]}"
              f"{_where(exc)}{'' if debug else '; run with --debug for the traceback'}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
