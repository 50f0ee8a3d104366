"""Files dse writes: output paths checked before work starts, every file written atomically,
strict JSON.

A file is written to a temporary file in the same folder, flushed and fsynced, renamed over
the target (``os.replace``, atomic on POSIX) and the folder fsynced, so a reader (or a
resumed sweep) sees the old file or the new one, never half of one (POSIX rename(2);
fsync(2) on the directory makes the rename durable).
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
from pathlib import Path

from dse.errors import InputError

__all__ = ["check_out_file", "check_out_dir", "atomic_open", "write_text", "write_bytes", "fsync_dir",
           "dumps", "finite_or_error", "TMP_MARK", "data_toml", "data_files"]

TMP_MARK = ".tmp-"     # temporary files are named .NAME.tmp-PID in the target's folder


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_out_dir(path, what: str) -> Path:
    """A folder dse may create or write into: not an existing file, its nearest existing
    ancestor a writable folder. Created here (so nothing fails after the work)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"{what}: {str(path)!r} is a file; allowed: a folder (new or existing)")
    base = _nearest_existing(path)
    if not base.is_dir():
        raise InputError(f"{what}: {str(base)!r} is a file, not a folder; allowed: a path under a writable folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise InputError(f"{what}: {str(base)!r} is not writable; allowed: a folder you can write")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{what}: cannot create {str(path)!r} ({exc.strerror}); allowed: a writable folder") from None
    return path


def check_out_file(path, what: str, *, suffixes=None) -> Path:
    """A file dse will write: its folder exists and is writable, the path is not a folder."""
    path = Path(path)
    if suffixes is not None and path.suffix.lower() not in suffixes:
        raise InputError(f"{what}: {str(path)!r} has an unsupported extension; allowed: {', '.join(suffixes)}")
    if path.is_dir():
        raise InputError(f"{what}: {str(path)!r} is a folder; allowed: a file name")
    parent = path.parent
    if not parent.exists():
        raise InputError(f"{what}: folder {str(parent)!r} does not exist; allowed: a file in an existing folder")
    if not parent.is_dir():
        raise InputError(f"{what}: {str(parent)!r} is a file, not a folder; allowed: a file in an existing folder")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise InputError(f"{what}: {str(path)!r} is not writable; allowed: a file in a folder you can write")
    return path


def fsync_dir(folder) -> None:
    """Make a rename or unlink in ``folder`` durable (fsync(2) of the directory)."""
    try:
        fd = os.open(str(folder), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:   # some file systems refuse fsync on a directory
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path, mode: str = "w", **kwargs):
    """``with atomic_open(p) as fh: ...``: writes go to a temporary file that replaces ``p``
    only when the block ends without an exception (then fsynced, renamed, folder fsynced)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")
    if "b" not in mode:
        kwargs.setdefault("newline", "")
        kwargs.setdefault("encoding", "utf-8")
    try:
        with open(tmp, mode, **kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def write_text(path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    with atomic_open(path, "w") as fh:
        fh.write(text)
    return Path(path)


def write_bytes(path, data: bytes) -> Path:
    with atomic_open(path, "wb") as fh:
        fh.write(data)
    return Path(path)


def finite_or_error(obj, what: str, path: str = "") -> None:
    """Raise InputError naming the first non-finite number in ``obj`` (a dict/list tree):
    a quantity that overflows float64 is an input error, never NaN in JSON."""
    if isinstance(obj, numbers.Real) and not isinstance(obj, int):
        if not math.isfinite(float(obj)):
            raise InputError(f"{what}: {path or 'a value'} is {obj!r} (the inputs overflow float64); "
                             f"allowed: inputs small enough that every figure is finite")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            finite_or_error(v, what, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            finite_or_error(v, what, f"{path}[{i}]")


def _nulled(obj):
    if isinstance(obj, numbers.Real) and not isinstance(obj, int):
        return float(obj) if math.isfinite(float(obj)) else None
    if isinstance(obj, dict):
        return {k: _nulled(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nulled(v) for v in obj]
    return obj


def dumps(obj, what: str = "output", *, strict: bool = False, **kwargs) -> str:
    """Strict JSON (RFC 8259 has no NaN or Infinity). ``strict``: a non-finite number is an
    InputError naming it (a plan whose figures overflow); else it is ``null`` (a figure that
    does not apply, such as the median of no rows)."""
    if strict:
        finite_or_error(obj, what)
    else:
        obj = _nulled(obj)
    return json.dumps(obj, allow_nan=False, **kwargs)


def read_text(path, what: str, allowed: str = "a readable text file") -> str:
    """A text file dse reads; missing, a folder, unreadable or binary is one InputError line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{what}: {str(path)!r} does not exist; allowed: {allowed}") from None
    except IsADirectoryError:
        raise InputError(f"{what}: {str(path)!r} is a folder; allowed: {allowed}") from None
    except UnicodeDecodeError:
        raise InputError(f"{what}: {str(path)!r} is not a UTF-8 text file; allowed: {allowed}") from None
    except OSError as exc:
        raise InputError(f"{what}: {str(path)!r} is not readable ({exc.strerror}); allowed: {allowed}") from None
    if "\x00" in text:
        raise InputError(f"{what}: {str(path)!r} is a binary file; allowed: {allowed}")
    return text


def read_csv_rows(path, what: str, allowed: str = "a CSV file with a header row", required=()) -> list[dict]:
    """The rows of a CSV file as dicts (csv.DictReader), file-level problems as one InputError line."""
    import csv
    import io

    text = read_text(path, what, allowed)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        rows = list(reader)
    except csv.Error as exc:
        raise InputError(f"{what}: {str(path)!r} is not valid CSV ({exc}); allowed: {allowed}") from None
    missing = [c for c in required if c not in (reader.fieldnames or ())]
    if missing:
        raise InputError(f"{what}: {str(path)!r} lacks column(s) {', '.join(missing)}; allowed: {allowed}")
    for row in rows:   # a short row's missing cells are empty, a long row's extra cells dropped
        row.pop(None, None)
        for k, v in row.items():
            if v is None:
                row[k] = ""
    return rows


# ---------------------------------------------------------------- dse's own data files, read once

_TOML: dict = {}
_LISTINGS: dict = {}


def data_toml(path) -> dict:
    """A TOML file of dse's data (presets, stack profiles) parsed once a process, again if the file
    changes (its mtime or size). Matching a published row to its GPU, model and stack reads every
    preset and profile: ``dse validate`` parsed 217 files for 56 rows (0.3 of its 1.1 CPU-s).
    The dict is shared: callers do not modify it (copy it first)."""
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key not in _TOML:
        import tomllib

        _TOML[key] = tomllib.loads(path.read_text())
    return _TOML[key]


def data_files(folder, suffix: str = ".toml") -> list:
    """The files of ``folder`` ending in ``suffix``, by name, listed again only when the folder changes."""
    st = folder.stat()
    key = (str(folder), suffix, st.st_mtime_ns)
    if key not in _LISTINGS:
        _LISTINGS[key] = sorted((p for p in folder.iterdir() if p.name.endswith(suffix)), key=lambda p: p.name)
    return _LISTINGS[key]
