"""A sweep's rows and dump as typed columns: axis columns by name, one column per objective.

The same columns serve ``SweepResult.top_frame()``/``pareto_frame()``/``dump_frame()``
(pandas), ``top.csv``/``pareto.csv`` and their Parquet copies: axis values as written in
the sweep file (numbers stay numbers, names stay strings), ``sweep_value`` a float for
the top rows and ``sweep_value.<objective>`` floats for the Pareto rows, then every
field of ``dse plan --json`` flattened (``memory_bytes.total``, ``plan.tp``).
"""

from __future__ import annotations

import numpy as np

from dse.report import flatten

__all__ = ["row_columns", "dump_columns", "frame", "read_dump_csv"]


def _typed(values: list) -> np.ndarray:
    """A column as int, float, bool or str, never object of mixed Python values."""
    if all(isinstance(v, (bool, np.bool_)) for v in values):
        return np.asarray(values, bool)
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        return np.asarray(values, np.int64)
    if all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in values):
        return np.asarray(values, np.float64)
    return np.asarray([str(v) for v in values], dtype=object)


def row_columns(spec, rows: list, objectives=None) -> dict[str, np.ndarray]:
    """Columns of ``rows`` (top or Pareto rows of a sweep). ``objectives``: names for a list ``sweep_value``."""
    axes = [a.name for a in spec.axes]
    flat = []
    for r in rows:
        out = {"index": int(r["index"])}
        for name in axes:
            out[name if name not in r else f"point.{name}"] = r["point"][name]
        sv = r.get("sweep_value")
        if isinstance(sv, (list, tuple)):
            names = list(objectives or spec.pareto) or [str(j) for j in range(len(sv))]
            out.update({f"sweep_value.{n}": float(v) for n, v in zip(names, sv)})
        elif sv is not None:
            out["sweep_value"] = float(sv)
        out.update(flatten({k: v for k, v in r.items() if k not in ("index", "point", "sweep_value")}))
        flat.append(out)
    if not flat:
        return {"index": np.zeros(0, np.int64), **{n: np.zeros(0) for n in axes}}
    keys = list(flat[0])
    return {k: _typed([f.get(k) for f in flat]) for k in keys}


def dump_columns(spec, dump: dict) -> dict[str, np.ndarray]:
    """Columns of a full dump: ``index``, each axis by name (as written), the dumped figures."""
    cols = {"index": np.asarray(dump["index"], np.int64)}
    for name, labels in spec.coords(cols["index"]).items():
        cols[name] = _typed(list(labels)) if labels.dtype == object else labels
    for k, v in dump.items():
        if k != "index":
            cols[k] = np.asarray(v)
    return cols


def frame(columns: dict):
    """A pandas DataFrame of columns (pandas is optional: ``pip install 'dse[frame]'``)."""
    try:
        import pandas as pd
    except ImportError as exc:   # pragma: no cover - depends on the environment
        raise ImportError("sweep frames need pandas: pip install 'dse[frame]'") from exc
    return pd.DataFrame(columns)


def read_dump_csv(path) -> dict[str, np.ndarray]:
    """A dump.csv written by ``run_sweep(out_dir=...)`` read back as the in-memory dump's columns
    (``index``, the dumped figures, ``reasons``, ``warnings``; axis columns left out)."""
    import csv

    from dse.engines.sweep.spec import DUMP_FIELDS

    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        head = next(reader)
        rows = list(reader)
    col = {h: j for j, h in enumerate(head)}
    out = {"index": np.array([int(r[col["index"]]) for r in rows], np.int64)}
    for f in DUMP_FIELDS:
        out[f] = np.array([float(r[col[f]]) for r in rows], np.float64)
    for f in ("reasons", "warnings"):
        out[f] = np.array([int(float(r[col[f]])) for r in rows], np.int64)
    return out
