"""The README is true: every `dse ...` command it shows runs, and the output it shows is what
dse prints (issue 15, item 11).

A fenced ```bash block with one `dse ...` command (alone or after `&&`) is a command; the fenced block right after
it (no language) is its output; so is an output block whose first line is `$ dse ...` (a
command with a pipe or a `$(...)` is shown, not checked). Every shown output line must appear in what the command prints,
except `...` (an elision) and lines with timings, which change from run to run. A ```python block
followed by an output block is run the same way. Commands run in-process from the repository root.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)\s*$")
# figures that depend on the machine and its load, never compared
VOLATILE = re.compile(r"plans/s|\bcompile\b|\d s on \d|\d s at |seconds|wall|CPU-s|\bs a case|load average", re.I)


def blocks(text: str):
    """(language, lines) of every fenced block, in order."""
    out, lang, cur = [], None, None
    for line in text.splitlines():
        m = FENCE.match(line)
        if m and cur is None:
            lang, cur = m.group(1), []
        elif m and cur is not None:
            out.append((lang, cur))
            cur = None
        elif cur is not None:
            cur.append(line)
    return out


def examples():
    """(kind, source, expected output lines) for each command block followed by an output block."""
    bs = blocks((ROOT / "README.md").read_text())
    found = []
    for lang, lines in bs:   # an output block that starts with its own `$ dse ...` line
        if lang == "" and lines and lines[0].startswith("$ dse ") and not re.search(r"[|]|\$\(", lines[0]):
            found.append(("dse", lines[0][2:].strip(), lines[1:]))
    for (lang, lines), (nlang, nlines) in zip(bs, bs[1:]):
        if nlang != "" or (nlines and nlines[0].startswith("$ ")):
            continue
        if lang == "bash":
            segments = [seg.strip() for ln in lines for seg in ln.split("&&")]
            cmds = [seg for seg in segments if seg.startswith("dse ")]
            if len(cmds) == 1:
                found.append(("dse", cmds[0], nlines))
        elif lang == "python":
            found.append(("python", "\n".join(lines), nlines))
    return found


def _norm(line: str) -> str:
    return " ".join(line.split())


@functools.lru_cache(maxsize=None)   # a command shown twice (two output blocks) runs once
def _run(kind: str, source: str) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.chdir(ROOT):
        if kind == "dse":
            from dse.cli import main

            code = main(shlex.split(source)[1:])
            assert code in (0, 1, 3), f"{source!r} exited {code}"   # 1, 3: an operator tool's WARN, FAIL
        else:
            exec(compile(source, "README.md", "exec"), {})
    return buf.getvalue()


EXAMPLES = examples()


def test_the_readme_has_checked_examples():
    assert len(EXAMPLES) >= 5


@pytest.mark.slow
@pytest.mark.parametrize("kind, source, expected", EXAMPLES, ids=[s[1][:60] for s in EXAMPLES])
def test_readme_example(kind, source, expected):
    got = {_norm(line) for line in _run(kind, source).splitlines()}
    missing = [line for line in expected
               if _norm(line) and _norm(line) != "..." and not VOLATILE.search(line) and _norm(line) not in got]
    assert not missing, f"{source!r} no longer prints:\n" + "\n".join(missing[:10])
