"""What a sweep has found so far and the files it writes: state for --resume, dump, top/pareto rows."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

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
        self.k = spec.top_k

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
        return {"fingerprint": fingerprint, "chunk_points": geo.chunk_points, "next_chunk": self.next_chunk,
                "counts": self.counts.tolist(), "top_val": self.top_val.tolist(), "top_idx": self.top_idx.tolist(),
                "par_val": self.par_val.tolist(), "par_idx": self.par_idx.tolist()}

    def load(self, d):
        self.next_chunk = int(d["next_chunk"])
        self.counts = np.asarray(d["counts"], np.int64)
        self.top_val = np.asarray(d["top_val"], np.float64)
        self.top_idx = np.asarray(d["top_idx"], np.int64)
        self.par_val = np.asarray(d["par_val"], np.float64).reshape(len(d["par_idx"]), self.par_val.shape[1])
        self.par_idx = np.asarray(d["par_idx"], np.int64)


def _write_atomic(path: Path, text: str):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)




# ---------------------------------------------------------------- files


def _keep_dump(spec, geo, k, cols, parts, out):
    _, _, nvalid, base = geo.chunk(k)
    n = nvalid * geo.inner
    cols = {f: np.asarray(v[:n]) for f, v in cols.items()}
    cols["index"] = base + np.arange(n, dtype=np.int64)
    if out is None:
        parts[k] = cols
    else:
        path = out / "dump" / f"part-{k:08d}.csv"
        tmp = path.with_name(path.name + ".tmp")
        _write_csv(tmp, spec, cols, header=False)
        os.replace(tmp, path)


def _dump_columns(spec, cols):
    coords = spec.coords(cols["index"])
    head = ["index"] + [a.name for a in spec.axes] + list(DUMP_FIELDS) + ["reasons", "warnings"]
    data = [cols["index"]] + [coords[a.name] for a in spec.axes] + [cols[f] for f in DUMP_FIELDS] \
        + [cols["reasons"], cols["warnings"]]
    return head, data


def _write_csv(path, spec, cols, header=True):
    head, data = _dump_columns(spec, cols)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        if header:
            w.writerow(head)
        w.writerows(zip(*[c.tolist() for c in data]))


def _finish_dump(spec, geo, parts, out):
    if out is None:
        keys = sorted(parts)
        return {f: np.concatenate([parts[k][f] for k in keys]) for f in parts[keys[0]]}
    head, _ = _dump_columns(spec, {"index": np.zeros(0, np.int64), **{f: np.zeros(0) for f in DUMP_FIELDS},
                                   "reasons": np.zeros(0), "warnings": np.zeros(0)})
    tmp = out / "dump.csv.tmp"
    with open(tmp, "w", newline="") as fh:
        csv.writer(fh).writerow(head)
        for k in range(geo.chunks):
            part = out / "dump" / f"part-{k:08d}.csv"
            fh.write(part.read_text())
    os.replace(tmp, out / "dump.csv")
    for k in range(geo.chunks):
        (out / "dump" / f"part-{k:08d}.csv").unlink()
    (out / "dump").rmdir()
    return None


def _write_rows(path: Path, columns: dict):
    """A CSV of typed columns, and Parquet with the same types when pyarrow is installed (optional)."""
    head = list(columns)
    n = len(columns[head[0]]) if head else 0
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(head)
        w.writerows(zip(*[columns[h].tolist() for h in head]) if n else [])
    os.replace(tmp, path)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return
    table = pa.table({h: pa.array(columns[h].tolist() if columns[h].dtype == object else columns[h]) for h in head})
    tmp = path.with_name(path.stem + ".parquet.tmp")
    pq.write_table(table, str(tmp))
    os.replace(tmp, path.with_suffix(".parquet"))


def _dump_parquet(out: Path):
    """dump.parquet from dump.csv (types read from the CSV: ints, floats, axis names as strings)."""
    try:
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq
    except ImportError:
        return
    tmp = out / "dump.parquet.tmp"
    pq.write_table(pacsv.read_csv(str(out / "dump.csv")), str(tmp))
    os.replace(tmp, out / "dump.parquet")


def _write_outputs(result: SweepResult, out: Path):
    _write_rows(out / "top.csv", row_columns(result.spec, result.top))
    if result.spec.pareto:
        _write_rows(out / "pareto.csv", row_columns(result.spec, result.pareto))
    if (out / "dump.csv").is_file():
        _dump_parquet(out)
    _write_atomic(out / "result.json", json.dumps(result.to_json(), indent=1))
