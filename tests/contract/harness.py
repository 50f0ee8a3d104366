"""Run ``dse`` in-process and check the contract of issue 14 on what it printed.

The contract: exit 0 (or a command's documented verdict code), or 2 with exactly one line on
stderr; never a traceback; strict JSON (no NaN/Infinity) on stdout for ``--json``.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from dse.cli import main
from dse.files import TMP_MARK

ROOT = Path(__file__).resolve().parents[2]
# dse check and dse rankmap --check answer PASS/WARN/FAIL as 0/1/3 (dse/ops/verdict.py).
VERDICT_CODES = {"check": (0, 1, 2, 3), "rankmap": (0, 2, 3), "nccl-log": (0, 1, 2, 3), "check-log": (0, 1, 2, 3)}


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def _no_constant(name):
    raise ValueError(f"not strict JSON: {name}")


def check_contract(argv, code, out, err, expect=None):
    argv = [str(a) for a in argv]
    allowed = VERDICT_CODES.get(argv[0] if argv else "", (0, 2))
    assert "Traceback" not in err and "Traceback" not in out, err[-2000:]
    assert code in allowed, (argv, code, err[-500:])
    if expect is not None:
        assert code == expect, (argv, code, out[-300:], err[-500:])
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1, (argv, err)
        assert lines[0].startswith("dse: error:"), lines
    if "--json" in argv and code != 2 and out.strip():
        json.loads(out, parse_constant=_no_constant)


def contract(argv, expect=None, needle=None):
    """Run ``argv``, check the contract; return (code, out, err)."""
    code, out, err = run(argv)
    check_contract(argv, code, out, err, expect)
    if needle is not None:
        assert needle in err + out, (argv, err, out[-300:])
    return code, out, err


def half_written(folder) -> list:
    """Temporary files dse left in ``folder`` (a write interrupted or failed)."""
    return [p for p in Path(folder).rglob("*") if TMP_MARK in p.name]
