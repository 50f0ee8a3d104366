"""Verdicts and exit codes shared by the operator tools, so any of them can gate a launch in CI.

Exit status: 0 every verdict PASS, 1 the worst is WARN, 3 at least one FAIL.
2 is left to bad input (argparse and ``InputError``), as everywhere in dse.
"""

from __future__ import annotations

import dataclasses

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
_RANK = {PASS: 0, WARN: 1, FAIL: 2}
EXIT = {PASS: 0, WARN: 1, FAIL: 3}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One answered question: a name, PASS/WARN/FAIL, one line of numbers, details."""

    name: str
    status: str
    summary: str
    details: tuple = ()


def worst(statuses) -> str:
    statuses = list(statuses)
    return max(statuses, key=_RANK.__getitem__) if statuses else PASS


def exit_code(statuses) -> int:
    return EXIT[worst(statuses)]
