"""What a sweep has found so far and the files it writes: state for --resume, dump, top/pareto rows."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dse import files
from dse.errors import InputError
from dse.report import REASONS
from dse.engines.sweep.spec import DUMP_FIELDS, PROBES, SweepSpec
from dse.engines.sweep.kernel import pareto_mask
from dse.engines.sweep.frames import row_columns

if TYPE_CHECKING:
    from dse.engines.sweep.run import SweepResult


class _State:
    """What a sweep has found so far (all exact, independent of chunking)."""

    def __init__(self, spec: SweepSpec):
        self.counts = np.zeros(2 + len(REASONS), np.int64)
        self.top_val = np.empty(0)
        self.top_idx = np.empty(0, np.int64)
        self.par_val = np.empty((0, len(spec.pareto)))
        self.par_idx = np.empty(0, np.int64)
        self.next_chunk = 0
        self.layout = None      # (split axis, tile) of a loaded state's chunks
        self.k = spec.top_k
        self.points = spec.points
        self.stage = "running"            # "merged" once dump.csv is durable (see open_out)

    def add_top(self, val, idx):
        val = np.concatenate([self.top_val, val])
        idx = np.concatenate([self.top_idx, idx])
        keep = np.isfinite(val)
        val, idx = val[keep], idx[keep]
        order = np.lexsort((idx, val))[: self.k]
        self.top_val, self.top_idx = val[order], idx[order]

    def add_pareto(self, val, idx):
        if len(idx) == 0:
            return
        val = np.concatenate([self.par_val, val])
        idx = np.concatenate([self.par_idx, idx])
        _, first = np.unique(idx, return_index=True)
        val, idx = val[first], idx[first]
        keep = pareto_mask(val, idx)
        order = np.lexsort((idx[keep],) + tuple(val[keep][:, j] for j in reversed(range(val.shape[1]))))
        self.par_val, self.par_idx = val[keep][order], idx[keep][order]

    def probes(self, nobj, dtype):
        size = PROBES.get(nobj, 1)
        pr = np.full((size, max(nobj, 1)), np.inf, dtype)
        m = len(self.par_idx)
        if m:
            pick = np.unique(np.linspace(0, m - 1, min(size, m)).round().astype(int))
            pr[: len(pick)] = self.par_val[pick]
        return pr

    def to_json(self, fingerprint, geo):
        return {"fingerprint": fingerprint, "chunk_points": geo.chunk_points, "split": geo.split, "tile": geo.tile,
                "next_chunk": self.next_chunk,
                "counts": self.counts.tolist(), "top_val": self.top_val.tolist(), "top_idx": self.top_idx.tolist(),
                "par_val": self.par_val.tolist(), "par_idx": self.par_idx.tolist()}

    def load(self, d):
        self.next_chunk = int(d["next_chunk"])
        self.layout = (d.get("split"), d.get("tile"))
        self.counts = np.asarray(d["counts"], np.int64)
        self.top_val = np.asarray(d["top_val"], np.float64)
        self.top_idx = np.asarray(d["top_idx"], np.int64)
        self.par_val = np.asarray(d["par_val"], np.float64).reshape(len(d["par_idx"]), self.par_val.shape[1])
        self.par_idx = np.asarray(d["par_idx"], np.int64)
        if any(np.ndim(a) != 1 for a in (self.counts, self.top_val, self.top_idx, self.par_idx)):
            raise ValueError("arrays are not lists")


def _write_atomic(path: Path, text: str):
    files.write_text(path, text)


# ---------------------------------------------------------------- state for --resume
#
# A sweep killed at any instruction resumes to the identical result: a chunk's part file is
# written atomically and fsynced before state.json (also atomic) counts the chunk done;
# finalization is idempotent: state.json records "stage": "merged" once dump.csv is durable, and
# part files are deleted only after that, so a resume either merges again (every part is there)
# or skips the merge; top.csv, pareto.csv and result.json are rewritten from the state each time.

_OUTPUTS = ("result.json", "top.csv", "pareto.csv", "top.parquet", "pareto.parquet", "dump.csv")


def _clean_tmp(folder: Path):
    if folder.is_dir():
        for p in folder.iterdir():
            if p.name.startswith(".") and files.TMP_MARK in p.name:
                p.unlink(missing_ok=True)


def open_out(out_dir, resume: bool, state: _State, fp: str, chunk_points: int, dump: bool):
    """The output folder (checked and created before any work), and the chunk size: the saved one
    on --resume, after loading the saved state into ``state``. Returns (out or None, chunk_points)."""
    if out_dir is None:
        if resume:
            raise InputError("--resume: needs --out DIR")
        return None, chunk_points
    out = files.check_out_dir(out_dir, "--out")
    state_path = out / "state.json"
    _clean_tmp(out)
    _clean_tmp(out / "dump")
    if not resume:   # a new sweep: nothing of an older one may be taken for its result
        for name in ("state.json",) + _OUTPUTS:
            (out / name).unlink(missing_ok=True)
        if (out / "dump").is_dir():
            for p in (out / "dump").glob("part-*.csv"):
                p.unlink()
        files.fsync_dir(out)
        return out, chunk_points
    if not state_path.is_file():
        raise InputError(f"--resume: {str(out)!r} holds no saved sweep (state.json); allowed: the --out of a sweep "
                         f"that ran, or no --resume")
    try:
        saved = json.loads(state_path.read_text())
        if not isinstance(saved, dict):
            raise ValueError("not a JSON object")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"--resume: {str(state_path)!r} is corrupt ({type(exc).__name__}); allowed: a state.json "
                         f"dse wrote, or run again without --resume") from None
    if saved.get("fingerprint") != fp:
        raise InputError(f"--resume: {str(out)!r} holds a different sweep; allowed: the same sweep file")
    try:
        chunk_points = int(saved["chunk_points"])
        if chunk_points < 1:
            raise ValueError("chunk_points")
        state.load(saved)
        idx = np.concatenate([state.top_idx, state.par_idx])
        if (state.next_chunk < 0 or len(state.counts) != 2 + len(REASONS) or len(state.top_idx) != len(state.top_val)
                or len(state.top_idx) > state.k or (state.counts < 0).any() or state.counts[0] > state.points
                or (len(idx) and (idx.min() < 0 or idx.max() >= state.points))
                or not np.isfinite(state.top_val).all() or not np.isfinite(state.par_val).all()
                or saved.get("stage", "running") not in ("running", "merged")):
            raise ValueError("fields out of range")
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
        raise InputError(f"--resume: {str(state_path)!r} is corrupt ({type(exc).__name__}: {' '.join(str(exc).split())[:80]}); allowed: a "
                         f"state.json dse wrote, or run again without --resume") from None
    state.stage = saved.get("stage", "running")
    if dump and state.stage == "running":
        (out / "dump").mkdir(exist_ok=True)
    return out, chunk_points


def check_loaded(state: _State, geo, out):
    """A resumed state must fit the grid's chunks, cut as it was saved: the saved chunk size gives the
    same chunks only under the same rule (kernel._Geometry), and a state written before the rule
    changed (or before it was saved) would count other points as done."""
    if state.layout is None:     # a new sweep
        return
    if state.layout != (geo.split, geo.tile):
        split, tile = state.layout
        raise InputError(f"--resume: {str(out / 'state.json')!r} was saved in chunks of another layout (split axis "
                         f"{split}, tile {tile}; this dse cuts axis {geo.split} in tiles of {geo.tile}); allowed: run "
                         f"again without --resume")
    if state.next_chunk > geo.chunks:
        raise InputError(f"--resume: {str(out / 'state.json')!r} is corrupt (next_chunk {state.next_chunk} > "
                         f"{geo.chunks} chunks); allowed: a state.json dse wrote, or run again without --resume")


def save_state(out: Path, state: _State, fp: str, geo):
    """state.json, atomically and durably (after the chunks it counts are durable)."""
    d = state.to_json(fp, geo)
    d["stage"] = getattr(state, "stage", "running")
    files.write_text(out / "state.json", json.dumps(d, allow_nan=False))


# ---------------------------------------------------------------- files


def _keep_dump(spec, geo, k, cols, parts, out):
    _, _, nvalid, base = geo.chunk(k)
    n = nvalid * geo.inner
    if out is None:
        # in memory: each column allocated once, at the sweep's size, and every chunk copied into
        # its own flat range (a dump keeps the sweep's order: kernel_order), so no part outlives its
        # chunk and no concatenation holds the columns twice at the end
        if not parts:
            parts.update({f: np.empty(spec.points, np.asarray(v).dtype) for f, v in cols.items()})
        for f, v in cols.items():
            parts[f][base:base + n] = v[:n]
        return
    cols = {f: np.asarray(v[:n]) for f, v in cols.items()}
    cols["index"] = base + np.arange(n, dtype=np.int64)
    with files.atomic_open(out / "dump" / f"part-{k:08d}.csv") as fh:
        _write_csv_to(fh, spec, cols, header=False)


def _dump_columns(spec, cols):
    coords = spec.coords(cols["index"])
    head = ["index"] + [a.name for a in spec.axes] + list(DUMP_FIELDS) + ["reasons", "warnings"]
    data = [cols["index"]] + [coords[a.name] for a in spec.axes] + [cols[f] for f in DUMP_FIELDS] \
        + [cols["reasons"], cols["warnings"]]
    return head, data


def _write_csv_to(fh, spec, cols, header=True):
    head, data = _dump_columns(spec, cols)
    w = csv.writer(fh)
    if header:
        w.writerow(head)
    w.writerows(zip(*[c.tolist() for c in data]))


def _finish_dump(spec, geo, parts, out, state=None, fp=None):
    """dump.csv from the part files (idempotent: see above); in memory without ``out``."""
    if out is None:
        return {**parts, "index": np.arange(spec.points, dtype=np.int64)}
    folder = out / "dump"
    if getattr(state, "stage", "running") != "merged":
        head, _ = _dump_columns(spec, {"index": np.zeros(0, np.int64), **{f: np.zeros(0) for f in DUMP_FIELDS},
                                       "reasons": np.zeros(0), "warnings": np.zeros(0)})
        with files.atomic_open(out / "dump.csv") as fh:
            csv.writer(fh).writerow(head)
            for k in range(geo.chunks):
                fh.write((folder / f"part-{k:08d}.csv").read_text())
        if state is not None:
            state.stage = "merged"
            save_state(out, state, fp, geo)
    if folder.is_dir():
        for p in folder.iterdir():
            p.unlink(missing_ok=True)
        folder.rmdir()
        files.fsync_dir(out)
    return None


def _write_rows(path: Path, columns: dict):
    """A CSV of typed columns, and Parquet with the same types when pyarrow is installed (optional);
    both written atomically (dse/files.py)."""
    head = list(columns)
    n = len(columns[head[0]]) if head else 0
    with files.atomic_open(path) as fh:
        w = csv.writer(fh)
        w.writerow(head)
        w.writerows(zip(*[columns[h].tolist() for h in head]) if n else [])
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return
    table = pa.table({h: pa.array(columns[h].tolist() if columns[h].dtype == object else columns[h]) for h in head})
    with files.atomic_open(path.with_suffix(".parquet"), "wb") as fh:
        pq.write_table(table, fh)


def _dump_parquet(out: Path):
    """dump.parquet from dump.csv (types read from the CSV: ints, floats, axis names as strings)."""
    try:
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq
    except ImportError:
        return
    with files.atomic_open(out / "dump.parquet", "wb") as fh:
        pq.write_table(pacsv.read_csv(str(out / "dump.csv")), fh)


def _write_outputs(result: SweepResult, out: Path):
    _write_rows(out / "top.csv", row_columns(result.spec, result.top))
    if result.spec.pareto:
        _write_rows(out / "pareto.csv", row_columns(result.spec, result.pareto))
    if (out / "dump.csv").is_file():
        _dump_parquet(out)
    files.write_text(out / "result.json", files.dumps(result.to_json(), "sweep result", indent=1))
