"""Sweeps: the Cartesian product of axes, evaluated on the device, reduced as it goes.

Each axis gets its own array dimension (shape ``(1, .., n_i, .., 1)``) and
``evaluate`` is called once on the broadcast inputs inside ``jit``, so XLA computes
a sub-expression once per combination of the axes it depends on, never per plan
(DESIGN.md, "broadcast over sweep axes"). The grid is never built on the host: the
flat index space (row-major, last axis fastest) is cut into contiguous chunks; a
chunk fixes the outer axes to one value each, takes a tile of one axis and all
values of the inner axes. Chunks run in groups of one per device (``shard_map``
over every device JAX sees) and each device returns only reductions:

* counts of points, feasible points and points per infeasibility reason (REASONS);
* the best ``top_k`` points of the objective, ties broken by flat index (exact:
  the best rows by (row minimum, row index), then a sort of those rows);
* Pareto candidates over 2-3 objectives: feasible points that no probe point (a
  few points of the front found so far) dominates, packed by rows; the host keeps
  the exact front, so the front never depends on chunking or device count;
* optionally every point's main outputs (the full dump, bounded by DUMP_LIMIT).

The reported rows (top and Pareto) are evaluated again one by one in float64 and
carry the fields of ``dse plan --json`` plus their sweep coordinates. With
``out_dir`` the state is written atomically after every finished group of chunks,
and ``resume=True`` continues from it with exactly the same final result.

Multi-host: call ``jax.distributed.initialize()`` in every process before
``run_sweep``; ``jax.devices()`` then lists every host's devices and the chunks of
one step are spread over all of them (README, "Sweeps").
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from dse import presets
from dse.errors import InputError
from dse.evaluate import evaluate
from dse.fidelity import resolve
from dse.inputs import RECOMPUTE, TOPOLOGIES, Cluster, ModelShape, Plan
from dse.report import REASONS, Report

__all__ = ["SweepSpec", "SweepResult", "Axis", "load_spec", "run_sweep", "pareto_mask",
           "AXIS_NAMES", "OBJECTIVES", "DUMP_FIELDS", "DUMP_LIMIT"]

# ---------------------------------------------------------------- axes and objectives

PLAN_INT = ("tp", "pp", "cp", "ep", "vpp", "mbs", "gbs")
PLAN_FIELDS = tuple(f.name for f in dataclasses.fields(Plan))     # tp ... sp, rank_order, ...
PLAN_INDEX = ("rank_order", "torus_order")                        # integers >= 0
PLAN_SWITCH = ("sp", "dp_hierarchical", "keep_stage_outputs")     # 0 or 1
MODEL_FIELDS = presets.MODEL_FIELDS
CLUSTER_UNITS = presets.CLUSTER_UNITS     # preset unit name -> (Cluster field, factor to SI)
AXIS_NAMES = ("model",) + PLAN_FIELDS + tuple(CLUSTER_UNITS) + MODEL_FIELDS
RECOMPUTE_NAMES = {v: k for k, v in RECOMPUTE.items()}

_REPORT_SCALARS = tuple(f.name for f in dataclasses.fields(Report)
                        if f.type == "jax.Array" and f.name not in ("reasons", "warnings", "feasible", "fits"))
# Objectives: any scalar figure of the Report, and the cluster size (a cost).
OBJECTIVES = _REPORT_SCALARS + ("gpus",)
MAXIMIZE = ("mfu", "tokens_per_s")        # natural direction of the objectives; the rest minimize
DUMP_FIELDS = ("step_s", "mfu", "tokens_per_s", "memory_bytes", "compute_s", "bubble_s")
DUMP_LIMIT = 10_000_000                   # points; a larger full dump is refused
PROBES = {2: 1024, 3: 64}                 # front points each device prunes Pareto rows with
CAP_ROWS = 64                             # candidate rows a device returns per chunk and pass
DEFAULT_CHUNK = 1 << 22
_IDLE = (0, 2**31 - 1, False)             # a device slot with nothing to do
_COMPILED: dict = {}                      # the last compiled kernel, by spec, geometry, devices


@dataclasses.dataclass(frozen=True)
class Axis:
    """One sweep axis: ``labels`` as written (GB/s, preset names), ``values`` in SI."""

    name: str
    labels: tuple
    values: tuple

    def __len__(self):
        return len(self.values)


def _number(where: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InputError(f"{where}: {v!r} is not a number; allowed: numbers")
    x = float(v)
    if not math.isfinite(x):
        raise InputError(f"{where}: {v!r} is not allowed; allowed: finite numbers")
    return x


def _value(name: str, v, where: str) -> float:
    """One value of input ``name`` in SI units, validated like ``dse plan``."""
    if name == "recompute":
        if isinstance(v, str):
            if v not in RECOMPUTE:
                raise InputError(f"{where}: unknown {v!r}; allowed: {', '.join(RECOMPUTE)} (or 0, 1, 2)")
            return RECOMPUTE[v]
        x = _number(where, v)
        if x not in (0.0, 1.0, 2.0):
            raise InputError(f"{where}: {v!r} is not allowed; allowed: {', '.join(RECOMPUTE)} (or 0, 1, 2)")
        return x
    if name == "topology" and isinstance(v, str):
        if v not in TOPOLOGIES:
            raise InputError(f"{where}: unknown {v!r}; allowed: {', '.join(TOPOLOGIES)} (or 0, 1, 2)")
        return TOPOLOGIES[v]
    if name in PLAN_SWITCH and isinstance(v, bool):
        return float(v)
    x = _number(where, v)
    if name in PLAN_INT and (x < 1 or x != int(x)):
        raise InputError(f"{where}: {v!r} is not allowed; allowed: integers >= 1")
    if name in PLAN_INDEX and (x < 0 or x != int(x)):
        raise InputError(f"{where}: {v!r} is not allowed; allowed: integers >= 0")
    if name == "zero" and x not in (0.0, 1.0, 2.0, 3.0):
        raise InputError(f"{where}: {v!r} is not allowed; allowed: 0, 1, 2, 3")
    if name in PLAN_SWITCH and x not in (0.0, 1.0):
        raise InputError(f"{where}: {v!r} is not allowed; allowed: 0, 1 (or true, false)")
    if name == "topology" and x not in TOPOLOGIES.values():
        raise InputError(f"{where}: {v!r} is not allowed; allowed: {', '.join(TOPOLOGIES)} (or 0, 1, 2)")
    if name in CLUSTER_UNITS:
        field, factor = CLUSTER_UNITS[name]
        try:
            return presets._check(name, x) * factor
        except InputError as exc:
            raise InputError(f"{where}: {str(exc).split(': ', 1)[1]}") from None
    if name in MODEL_FIELDS:
        try:
            return presets._check(name, x)
        except InputError as exc:
            raise InputError(f"{where}: {str(exc).split(': ', 1)[1]}") from None
    return x


def _axis(name: str, raw) -> Axis:
    where = f"axes.{name}"
    if name not in AXIS_NAMES:
        raise InputError(f"{where}: unknown axis; allowed: {', '.join(AXIS_NAMES)}")
    if not isinstance(raw, (list, tuple)):
        raw = [raw]
    if len(raw) == 0:
        raise InputError(f"{where}: empty axis; allowed: a list of one or more values")
    if name == "model":
        for v in raw:
            if not isinstance(v, str):
                raise InputError(f"{where}: {v!r} is not a preset name; allowed: {', '.join(presets.list_presets('models'))}")
            presets.load_model(v)   # raises a one-line InputError for an unknown preset
        return Axis(name, tuple(raw), tuple(float(i) for i in range(len(raw))))
    return Axis(name, tuple(raw), tuple(_value(name, v, where) for v in raw))


def _objective(name: str, where: str) -> tuple[str, float]:
    """(name, sign): the sweep minimizes sign * value."""
    if name not in OBJECTIVES:
        raise InputError(f"{where}: unknown objective {name!r}; allowed: {', '.join(OBJECTIVES)}")
    return name, (-1.0 if name in MAXIMIZE else 1.0)


# ---------------------------------------------------------------- the spec


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """What to sweep. Build with ``SweepSpec.make`` or ``SweepSpec.from_dict`` (a TOML table).

    ``model`` and ``cluster`` hold the base inputs (float64 scalars); ``plan`` the
    base plan fields in SI (recompute as 0/1/2); an axis replaces one input by a
    list. ``objective`` is minimized (or maximized when ``maximize``); ``pareto``
    names 2-3 objectives in their natural directions (mfu and tokens_per_s up,
    everything else down); ``dump`` keeps every point's DUMP_FIELDS.
    """

    model: ModelShape
    cluster: Cluster
    plan: dict
    axes: tuple
    model_presets: tuple = ()
    model_table: tuple = ()      # per preset of the ``model`` axis: its fields (with [model] overrides)
    objective: str = "step_s"
    maximize: bool = False
    top_k: int = 10
    pareto: tuple = ()
    dump: bool = False
    fidelity: str = "seed"
    precision: str = "float32"
    name: str = ""

    @property
    def sizes(self) -> tuple:
        return tuple(len(a) for a in self.axes)

    @property
    def points(self) -> int:
        return math.prod(self.sizes)

    @classmethod
    def make(cls, *, model="llama3-405b", cluster="seed", plan=None, axes=None, objective="step_s",
             maximize=None, top_k=10, pareto=(), dump=False, fidelity="seed", precision="float32", name=""):
        """Build a spec in Python: ``model``/``cluster`` a preset name or a dict of fields
        (preset units for the cluster), ``plan`` a dict, ``axes`` a dict name -> list."""
        d = {"model": model if isinstance(model, dict) else {"preset": model},
             "cluster": cluster if isinstance(cluster, dict) else {"preset": cluster},
             "plan": dict(plan or {}), "axes": dict(axes or {}),
             "objective": {("maximize" if (maximize if maximize is not None else objective in MAXIMIZE)
                            else "minimize"): objective},
             "output": {"top": top_k, "pareto": list(pareto), "dump": dump},
             "fidelity": fidelity, "precision": precision, "name": name}
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: dict) -> "SweepSpec":
        with jax.enable_x64(True):   # base inputs in float64, whatever the process's default
            return cls._from_dict(d)

    @classmethod
    def _from_dict(cls, d: dict) -> "SweepSpec":
        known = {"model", "cluster", "plan", "axes", "objective", "output", "fidelity", "precision",
                 "name", "description"}
        unknown = set(d) - known
        if unknown:
            raise InputError(f"sweep file: unknown table(s) {sorted(unknown)}; allowed: {', '.join(sorted(known))}")
        axes_raw = d.get("axes") or {}
        if not isinstance(axes_raw, dict) or not axes_raw:
            raise InputError("axes: give at least one axis, e.g. [axes] tp = [1, 2, 4, 8]")
        axes = tuple(_axis(k, v) for k, v in axes_raw.items())
        names = [a.name for a in axes]
        # the base model: a preset, fields, or a preset with overrides
        m = dict(d.get("model") or {})
        preset = m.pop("preset", None)
        presets_axis = next((a.labels for a in axes if a.name == "model"), ())
        if preset is None and presets_axis:
            preset = presets_axis[0]
        if preset is not None:
            if not isinstance(preset, str):
                raise InputError(f"model.preset: {preset!r} is not a preset name")
            model = presets.load_model(preset, **m)
        else:
            model = presets.model_from_fields(m)
        c = dict(d.get("cluster") or {})
        cpreset = c.pop("preset", "seed")
        cluster = presets.load_cluster(cpreset, **c)
        plan_raw = dict(d.get("plan") or {})
        bad = set(plan_raw) - set(PLAN_FIELDS)
        if bad:
            raise InputError(f"plan: unknown field(s) {sorted(bad)}; allowed: {', '.join(PLAN_FIELDS)}")
        plan = {f.name: float(f.default) for f in dataclasses.fields(Plan) if f.default is not dataclasses.MISSING}
        plan.update({"tp": 1.0, "pp": 1.0, "mbs": 1.0})
        plan.update({k: _value(k, v, f"plan.{k}") for k, v in plan_raw.items()})
        if "gbs" not in plan and "gbs" not in names:
            raise InputError("plan.gbs: missing; give the global batch in [plan] or as an axis")
        obj = dict(d.get("objective") or {"minimize": "step_s"})
        if set(obj) - {"minimize", "maximize"} or len(obj) != 1:
            raise InputError("objective: give one of minimize = NAME or maximize = NAME")
        ((direction, objective),) = obj.items()
        _objective(objective, f"objective.{direction}")
        out = dict(d.get("output") or {})
        bad = set(out) - {"top", "pareto", "dump"}
        if bad:
            raise InputError(f"output: unknown field(s) {sorted(bad)}; allowed: top, pareto, dump")
        top_k = out.get("top", 10)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= 1000:
            raise InputError(f"output.top: {top_k!r} is not allowed; allowed: an integer 1..1000")
        pareto = tuple(out.get("pareto", ()))
        if pareto and not 2 <= len(pareto) <= 3:
            raise InputError(f"output.pareto: {list(pareto)!r}; allowed: 2 or 3 objective names")
        for p in pareto:
            _objective(p, "output.pareto")
        dump = out.get("dump", False)
        if not isinstance(dump, bool):
            raise InputError(f"output.dump: {dump!r} is not allowed; allowed: true, false")
        fidelity = d.get("fidelity", "seed")
        if fidelity not in ("seed", "calibrated"):
            raise InputError(f"fidelity: unknown {fidelity!r}; allowed: seed, calibrated")
        precision = d.get("precision", "float32")
        if precision not in ("float32", "float64"):
            raise InputError(f"precision: {precision!r}; allowed: float32, float64")
        table = tuple({k: float(v) for k, v in presets.load_model(n, **m).to_dict().items()} for n in presets_axis)
        spec = cls(model=model, cluster=cluster, plan=plan, axes=axes, model_presets=tuple(presets_axis),
                   model_table=table,
                   objective=objective, maximize=direction == "maximize", top_k=top_k, pareto=pareto,
                   dump=dump, fidelity=fidelity, precision=precision, name=str(d.get("name", "")))
        if dump and spec.points > DUMP_LIMIT:
            raise InputError(f"output.dump: {spec.points:,} points is above the full-dump limit of "
                             f"{DUMP_LIMIT:,}; allowed: dump = false, or fewer points")
        return spec

    def fingerprint(self) -> str:
        """A hash of everything that decides the result (for --resume)."""
        f = lambda t: {k: float(np.asarray(v)) for k, v in t.to_dict().items()}  # noqa: E731
        blob = json.dumps({"model": f(self.model), "cluster": f(self.cluster), "plan": self.plan,
                           "axes": [[a.name, list(a.values)] for a in self.axes], "presets": list(self.model_table),
                           "objective": [self.objective, self.maximize], "top": self.top_k,
                           "pareto": list(self.pareto), "dump": self.dump, "fidelity": self.fidelity,
                           "precision": self.precision}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def coords(self, index) -> dict:
        """Axis values (as written) of flat point index(es)."""
        idx = np.unravel_index(np.asarray(index, dtype=np.int64), self.sizes)
        return {a.name: np.asarray(a.labels, dtype=object)[i] for a, i in zip(self.axes, idx)}


def load_spec(path) -> SweepSpec:
    """Read a sweep file (TOML)."""
    d = presets.read_toml(path, "sweep file")
    d.setdefault("name", Path(path).stem)
    return SweepSpec.from_dict(d)


# ---------------------------------------------------------------- inputs from axis arrays


def _inputs(spec: SweepSpec, arrays: dict, dtype):
    """(model, cluster, plan) with the base values, axis arrays substituted (broadcasting)."""
    cast = lambda x: jnp.asarray(x, dtype)  # noqa: E731
    mvals = {k: cast(v) for k, v in spec.model.to_dict().items()}
    cvals = {k: cast(v) for k, v in spec.cluster.to_dict().items()}
    pvals = {k: cast(v) for k, v in spec.plan.items()}
    if "model" in arrays:
        i = jnp.asarray(arrays["model"]).astype(jnp.int32)
        for k in mvals:
            mvals[k] = jnp.asarray(np.array([t[k] for t in spec.model_table]), dtype)[i]
    for name, arr in arrays.items():
        if name in PLAN_FIELDS:
            pvals[name] = cast(arr)
        elif name in CLUSTER_UNITS:
            cvals[CLUSTER_UNITS[name][0]] = cast(arr)
        elif name in MODEL_FIELDS:
            mvals[name] = cast(arr)
    return ModelShape(**mvals), Cluster(**cvals), Plan(**pvals)


def _objective_value(rep: Report, cluster: Cluster, name: str):
    return cluster.gpus if name == "gpus" else getattr(rep, name)


# ---------------------------------------------------------------- chunk geometry


@dataclasses.dataclass(frozen=True)
class _Geometry:
    """Chunks: axes before ``split`` fixed, a tile of ``tile`` values of axis ``split``, inner axes whole."""

    sizes: tuple
    split: int
    tile: int
    inner: int          # points per value of the split axis in a chunk
    row_dim: int        # chunk dimensions from this one on form a row (top-K, Pareto packing)

    @property
    def row(self):
        return math.prod(self.dims[self.row_dim:])

    @classmethod
    def make(cls, sizes, chunk_points):
        suffix = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
        split = next(i for i in range(len(sizes)) if suffix[i] <= chunk_points)
        inner = suffix[split]
        tile = min(sizes[split], max(1, chunk_points // inner))
        dims = (tile,) + tuple(sizes[split + 1:])
        # a row is the trailing chunk dimensions from ``row_dim`` on (reduced without a reshape)
        row_dim = next((j for j in reversed(range(1, len(dims))) if math.prod(dims[j:]) >= 128), 0)
        return cls(tuple(sizes), split, tile, inner, row_dim)

    @property
    def dims(self):
        return (self.tile,) + self.sizes[self.split + 1:]

    @property
    def chunk_points(self):
        return self.tile * self.inner

    @property
    def tiles(self):
        return -(-self.sizes[self.split] // self.tile)

    @property
    def chunks(self):
        return math.prod(self.sizes[:self.split]) * self.tiles

    def chunk(self, k):
        """(outer coordinates, first split index, valid split values, first flat index) of chunk k."""
        outer, t = divmod(k, self.tiles)
        oc = np.unravel_index(outer, self.sizes[:self.split]) if self.split else ()
        j0 = t * self.tile
        nvalid = min(self.tile, self.sizes[self.split] - j0)
        base = (outer * self.sizes[self.split] + j0) * self.inner
        return tuple(int(x) for x in oc), j0, nvalid, base


# ---------------------------------------------------------------- the device kernel


def _build_kernel(spec: SweepSpec, geo: _Geometry, mesh: Mesh, dtype):
    """A jitted function of a group of chunks (one per device) returning reductions.

    A chunk has one array dimension per chunk axis (the split axis's tile first), so
    XLA computes each sub-expression once per combination of the axes it depends on.
    A row is the trailing dimensions from ``row_dim`` on: a contiguous run of flat
    indices, reduced in place (a reshape of the unmaterialized grid would be slow).
    """
    fid = jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype), resolve(spec.fidelity))
    axes = spec.axes
    s = geo.split
    dims = geo.dims
    r = len(dims)
    n = geo.chunk_points
    R = geo.row
    G = n // R
    K = min(spec.top_k, n)
    KR = min(K, G)
    objs = [_objective(p, "pareto") for p in spec.pareto]
    sign = -1.0 if spec.maximize else 1.0
    nbits = len(REASONS)
    tail = tuple(range(geo.row_dim, r))
    at = lambda j, v: jnp.reshape(v, [-1 if i == j else 1 for i in range(r)])  # noqa: E731  axis j of the chunk
    inner = {a.name: np.asarray(a.values, dtype) for a in axes[s + 1:]}

    def one(outer_vals, tile_vals, nvalid, skip_below, first, probes):
        arrays = {a.name: outer_vals[i] for i, a in enumerate(axes[:s])}
        arrays[axes[s].name] = at(0, tile_vals)
        arrays.update({name: at(j, jnp.asarray(v)) for j, (name, v) in enumerate(inner.items(), start=1)})
        model, cluster, plan = _inputs(spec, arrays, dtype)
        rep = evaluate(model, cluster, plan, fid)
        valid = jnp.broadcast_to(at(0, jnp.arange(dims[0]) < nvalid), dims)
        reasons = jnp.broadcast_to(rep.reasons, dims)
        feas = valid & (reasons == 0)
        # counts: points, feasible, per reason bit (only on a chunk's first pass)
        cnt = [jnp.sum(valid, dtype=jnp.int32), jnp.sum(feas, dtype=jnp.int32)]
        cnt += [jnp.sum(valid & (((reasons >> k) & 1) == 1), dtype=jnp.int32) for k in range(nbits)]
        counts = jnp.stack(cnt) * first.astype(jnp.int32)
        # Infeasible points cost +inf: a penalty array materialized on its own, then added.
        # (One fusion of where(reasons == 0, step, inf) recomputes the whole model per point on
        # XLA:CPU, 5x slower; the sum lets XLA compute step_s at its own, smaller rank.)
        bar = jax.lax.optimization_barrier
        pen = bar(jnp.where(feas, jnp.float32(0), jnp.float32(jnp.inf)).astype(dtype))

        def cost(name, sg):   # elementwise work on the full grid stays on materialized arrays
            return bar(sg * _objective_value(rep, cluster, name) + pen)

        # top-K by (value, index): the K best rows by (row min, row), then a sort of those rows.
        # A chunk's extra Pareto passes (first = False) add no top rows. A row whose minimum is
        # NaN (a feasible plan with an undefined objective) is skipped: nanmin costs 5x here.
        o = cost(spec.objective, sign)
        rowmin = jnp.min(o, axis=tail).reshape(G)
        rowmin = jnp.where(first & ~jnp.isnan(rowmin), rowmin, jnp.inf)
        o = o.reshape(G, R)
        _, rows = jax.lax.sort((rowmin, jnp.arange(G, dtype=jnp.int32)), num_keys=2)
        rows = rows[:KR]
        cand = o[rows].reshape(-1)
        cand = jnp.where(first & ~jnp.isnan(cand), cand, jnp.inf)
        cidx = (rows[:, None] * R + jnp.arange(R, dtype=jnp.int32)[None, :]).reshape(-1)
        tv, ti = jax.lax.sort((cand, cidx), num_keys=2)
        out = {"counts": counts, "top_val": tv[:K], "top_idx": ti[:K]}
        if objs:
            Fs = [cost(nm, sg).reshape(G, R) for nm, sg in objs]    # materialized: (rows, row) is free
            real = functools.reduce(jnp.logical_and, [jnp.isfinite(f) for f in Fs])
            rowok = jnp.any(real, axis=1) & ~_rows_dominated(Fs, real, probes, (1,), G)
            rowok = rowok & (jnp.arange(G, dtype=jnp.int32) >= skip_below // R)
            (crow,) = jnp.nonzero(rowok, size=CAP_ROWS, fill_value=G)
            crow_c = jnp.minimum(crow, G - 1)
            pok = real[crow_c] & (crow < G)[:, None]
            out["par_val"] = jnp.stack([f[crow_c].reshape(-1) for f in Fs], axis=-1)
            out["par_idx"] = jnp.where(pok, crow_c[:, None] * R + jnp.arange(R, dtype=jnp.int32), -1).reshape(-1)
            out["par_rows"] = jnp.sum(rowok, dtype=jnp.int32)
            out["par_next"] = (crow_c[-1] + 1) * R
        if spec.dump:   # each output at its own rank, then broadcast (see ``cost``)
            names = DUMP_FIELDS + ("reasons", "warnings")
            vals = bar(tuple(getattr(rep, f) for f in names))
            out.update({f: jnp.broadcast_to(v, dims).reshape(-1) for f, v in zip(names, vals)})
        return out

    dumped = set(DUMP_FIELDS + ("reasons", "warnings")) if spec.dump else set()

    def group(outer_vals, tile_vals, nvalid, skip_below, first, probes):
        res = one(outer_vals[0], tile_vals[0], nvalid[0], skip_below[0], first[0], probes)
        # reductions are gathered onto every device, so every process (host) can read them;
        # a dump stays where it was computed
        return {k: v[None] if k in dumped else jax.lax.all_gather(v, "d") for k, v in res.items()}

    spec_d = P("d")
    out_keys = jax.eval_shape(lambda: one(*_example_args(geo, spec, dtype))).keys()
    fn = jax.shard_map(group, mesh=mesh, in_specs=(spec_d, spec_d, spec_d, spec_d, spec_d, P()),
                       out_specs={k: spec_d if k in dumped else P() for k in out_keys}, check_vma=False)
    return jax.jit(fn)


def _example_args(geo, spec, dtype):
    """Arguments of one chunk's kernel (shapes only matter)."""
    return (np.zeros(geo.split, dtype), np.zeros(geo.tile, dtype), np.int32(0), np.int32(0), np.bool_(False),
            np.zeros((PROBES.get(len(spec.pareto), 1), max(len(spec.pareto), 1)), dtype))


def _lexmin_rows(Fs, real, first, tail, G):
    """Per row, the lexicographic minimum with objective ``first`` first (a real point, (G, k))."""
    k = len(Fs)
    mask = real
    vals = [None] * k
    for i in [first] + [i for i in range(k) if i != first]:
        m = jnp.min(jnp.where(mask, Fs[i], jnp.inf), axis=tail, keepdims=True)
        mask = mask & (Fs[i] == m)
        vals[i] = m.reshape(G)
    return jnp.stack(vals, axis=-1)


def _rows_dominated(Fs, real, probes, tail, G):
    """Rows whose every point some known point strictly dominates (safe: only real points prune).

    A row's ideal point (its minimum in each objective) lower-bounds its points; when a
    known point strictly dominates the ideal, it strictly dominates the whole row.
    Known points: ``probes`` (the front so far) and each row's lexicographic minima.
    Two objectives: exact test against all of them through the sorted staircase;
    three: against the probes and the chunk's lexicographic minima.
    """
    k = len(Fs)
    inf = jnp.asarray(jnp.inf, Fs[0].dtype)
    ideal = jnp.stack([jnp.min(jnp.where(real, f, inf), axis=tail).reshape(G) for f in Fs], axis=-1)  # (G, k)
    lex = [_lexmin_rows(Fs, real, j, tail, G) for j in range(k)]
    if k == 2:
        known = jnp.concatenate([probes] + lex, axis=0)
        q1, q2 = jax.lax.sort((known[:, 0], known[:, 1]), num_keys=2)
        best2 = jax.lax.associative_scan(jnp.minimum, q2)          # min f2 over q1 <= sorted position
        a1, a2 = ideal[:, 0], ideal[:, 1]
        le = jnp.searchsorted(q1, a1, side="right")                 # known points with q1 <= a1
        lt = jnp.searchsorted(q1, a1, side="left")                  # known points with q1 < a1
        g_le = jnp.where(le > 0, best2[jnp.maximum(le - 1, 0)], inf)
        g_lt = jnp.where(lt > 0, best2[jnp.maximum(lt - 1, 0)], inf)
        return (g_le < a2) | (g_lt <= a2)
    pts = []
    for j, x in enumerate(lex):   # the chunk's lexicographic minimum with objective j first
        order = [j] + [i for i in range(k) if i != j]
        out = jax.lax.sort(tuple(x[:, i] for i in order) + tuple(x[:, i] for i in range(k)), num_keys=k)
        pts.append(jnp.stack([v[0] for v in out[k:]]))
    known = jnp.concatenate([probes, jnp.stack(pts)], axis=0)
    dom = jnp.zeros(ideal.shape[0], bool)
    for q in range(known.shape[0]):
        le = jnp.all(known[q] <= ideal, axis=-1)
        lt = jnp.any(known[q] < ideal, axis=-1)
        dom = dom | (le & lt)
    return dom


# ---------------------------------------------------------------- host-side merges


def pareto_mask(values, index) -> np.ndarray:
    """The exact Pareto front (minimization) of points ``values`` (n, k) with flat ``index`` (n,).

    A point is dropped when another is no worse in every objective and better in
    one, or equal in all and earlier in the sweep (so duplicates keep one point).
    """
    values = np.asarray(values, dtype=np.float64)
    index = np.asarray(index, dtype=np.int64)
    n, k = values.shape
    keep = np.zeros(n, bool)
    if n == 0:
        return keep
    order = np.lexsort((index,) + tuple(values[:, j] for j in reversed(range(k))))
    if k == 2:
        # sorted by (f1, f2, index): a point survives when its f2 beats every earlier f2
        f2 = values[order, 1]
        best = np.minimum.accumulate(np.concatenate([[np.inf], f2[:-1]]))
        keep[order[f2 < best]] = True
        return keep
    # general k: sweep in sorted order, test each point against the front kept so far
    front = np.empty((0, k))
    for i in order:
        v = values[i]
        if front.shape[0] and np.any(np.all(front <= v, axis=1)):
            continue   # an earlier point (in lexicographic order) covers it
        keep[i] = True
        front = np.vstack([front, v])
    return keep


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


# ---------------------------------------------------------------- results


@dataclasses.dataclass
class SweepResult:
    """What ``run_sweep`` found. Rows are dicts like ``dse plan --json`` plus ``index``, ``point``, ``plan``."""

    spec: SweepSpec
    points: int                  # points in the grid
    done: int                    # points evaluated (== points unless stopped early)
    feasible: int
    infeasible_by_reason: dict
    seconds: float
    points_per_s: float
    compile_s: float
    cpu_s: float                 # CPU seconds this process spent in the sweep loop (all threads)
    best: dict | None
    top: list
    pareto: list
    devices: int
    chunks: int
    chunk_points: int
    dump: dict | None = None     # DUMP_FIELDS + reasons, warnings, index (numpy), when asked

    @property
    def complete(self) -> bool:
        return self.done == self.points

    def to_json(self) -> dict:
        return {"name": self.spec.name, "points": self.points, "done": self.done, "feasible": self.feasible,
                "seconds": self.seconds, "points_per_s": self.points_per_s, "compile_s": self.compile_s,
                "cpu_s": self.cpu_s,
                "devices": self.devices, "chunks": self.chunks, "chunk_points": self.chunk_points,
                "objective": {("maximize" if self.spec.maximize else "minimize"): self.spec.objective},
                "pareto_objectives": list(self.spec.pareto),
                "best": self.best, "top": self.top, "pareto": self.pareto,
                "infeasible_by_reason": self.infeasible_by_reason}


_evaluate_jit = jax.jit(evaluate, static_argnums=3)


def _rows(spec: SweepSpec, index: np.ndarray, sweep_values) -> list:
    """Re-evaluate points exactly (float64, one batched call) into ``dse plan --json`` rows."""
    if len(index) == 0:
        return []
    index = np.asarray(index, np.int64)
    size = max(16, 1 << (len(index) - 1).bit_length())      # a few batch sizes: few compilations
    padded = np.concatenate([index, np.full(size - len(index), index[0])])
    idx = np.unravel_index(padded, spec.sizes)
    with jax.enable_x64(True):
        arrays = {a.name: np.asarray(a.values, np.float64)[i] for a, i in zip(spec.axes, idx)}
        model, cluster, plan = _inputs(spec, arrays, jnp.float64)
        model, cluster, plan = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (size,)), (model, cluster, plan))
        rep = jax.device_get(_evaluate_jit(model, cluster, plan, spec.fidelity))
        plan = jax.device_get(plan)
    rows = []
    for j, flat in enumerate(index):
        row = {"index": int(flat),
               "point": {a.name: _plain(a.labels[i[j]]) for a, i in zip(spec.axes, idx)},
               "sweep_value": sweep_values[j]}
        row.update(jax.tree_util.tree_map(lambda x: np.broadcast_to(x, (size,))[j], rep).to_json())
        row["plan"] = {k: float(v[j]) for k, v in plan.to_dict().items()}
        row["fidelity"] = spec.fidelity
        rows.append(row)
    return rows


def _plain(x):
    return x.item() if hasattr(x, "item") else x


# ---------------------------------------------------------------- the driver


def run_sweep(spec: SweepSpec, *, chunk_points: int = DEFAULT_CHUNK, out_dir=None, resume: bool = False,
              progress: Callable[[int, int, float], Any] | None = None, max_chunks: int | None = None,
              devices=None) -> SweepResult:
    """Evaluate every point of ``spec``'s grid and reduce it.

    ``chunk_points`` bounds the points a device holds at once (memory). With
    ``out_dir`` the state is saved after every group of chunks (atomically) and
    top/Pareto CSVs (and the dump) are written at the end; ``resume`` continues a
    sweep saved there. ``progress(done, total, seconds)`` is called after each
    group. ``max_chunks`` stops early (the result then has ``complete == False``).
    """
    if not isinstance(chunk_points, int) or chunk_points < 1:
        raise InputError(f"--chunk: {chunk_points!r} is not allowed; allowed: an integer >= 1")
    if spec.dump and jax.process_count() > 1:
        raise InputError("output.dump: not supported across several processes; allowed: dump = false")
    t_start = time.perf_counter()
    devices = list(devices or jax.devices())
    D = len(devices)
    mesh = Mesh(np.array(devices), ("d",))
    dtype = np.float32 if spec.precision == "float32" else np.float64
    fp = spec.fingerprint()
    state = _State(spec)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        state_path = out / "state.json"
        if resume:
            if not state_path.is_file():
                raise InputError(f"--resume: {str(out)!r} holds no saved sweep (state.json)")
            saved = json.loads(state_path.read_text())
            if saved.get("fingerprint") != fp:
                raise InputError(f"--resume: {str(out)!r} holds a different sweep; allowed: the same sweep file")
            chunk_points = int(saved["chunk_points"])
            state.load(saved)
    elif resume:
        raise InputError("--resume: needs --out DIR")
    geo = _Geometry.make(spec.sizes, chunk_points)
    nobj = len(spec.pareto)
    x64 = dtype == np.float64
    with jax.enable_x64(x64):
        kernel = _build_kernel(spec, geo, mesh, dtype)   # tracing is lazy: cheap when cached below
        shard = NamedSharding(mesh, P("d"))
        repl = NamedSharding(mesh, P())
        s = geo.split
        ax_s = np.asarray(spec.axes[s].values, dtype)
        outer_axes = [np.asarray(a.values, dtype) for a in spec.axes[:s]]

        def args_for(items):
            ov = np.zeros((D, s), dtype)
            tv = np.zeros((D, geo.tile), dtype)
            nv = np.zeros(D, np.int32)
            sk = np.zeros(D, np.int32)
            first = np.zeros(D, bool)
            for d, (k, skip, fst) in enumerate(items):
                oc, j0, nvalid, _ = geo.chunk(k)
                ov[d] = [outer_axes[i][c] for i, c in enumerate(oc)]
                vals = ax_s[j0:j0 + nvalid]
                tv[d] = np.concatenate([vals, np.full(geo.tile - nvalid, vals[-1], dtype)])
                nv[d], sk[d], first[d] = nvalid, skip, fst
            probes = state.probes(nobj, dtype)
            # every process builds the same host arrays; each places its own devices' slices
            put = lambda a, sh: jax.make_array_from_callback(a.shape, sh, lambda i: a[i])  # noqa: E731
            return (put(ov, shard), put(tv, shard), put(nv, shard), put(sk, shard), put(first, shard),
                    put(probes, repl))

        t0 = time.perf_counter()
        key = (fp, geo, tuple(devices), np.dtype(dtype).name, CAP_ROWS, PROBES.get(nobj))
        if key not in _COMPILED:   # a notebook or test re-running a sweep compiles it once
            _COMPILED.clear()
            _COMPILED[key] = kernel.lower(*args_for([_IDLE] * D)).compile()
        compiled = _COMPILED[key]
        compile_s = time.perf_counter() - t0

        dump_parts = {} if spec.dump else None
        if spec.dump and out is not None:
            (out / "dump").mkdir(exist_ok=True)
        last = geo.chunks if max_chunks is None else min(geo.chunks, state.next_chunk + max_chunks)
        t_run = time.perf_counter()
        cpu_run = time.process_time()
        done_here = 0
        while state.next_chunk < last:
            ks = list(range(state.next_chunk, min(last, state.next_chunk + D)))
            queue = [(k, 0, True) for k in ks]
            while queue:
                items, queue = queue[:D], queue[D:]
                items += [_IDLE] * (D - len(items))
                res = jax.device_get(compiled(*args_for(items)))
                for d, (k, skip, fst) in enumerate(items):
                    if (k, skip, fst) == _IDLE:
                        continue
                    base = geo.chunk(k)[3]
                    if fst:
                        state.counts += res["counts"][d]
                        state.add_top(res["top_val"][d].astype(np.float64), base + res["top_idx"][d].astype(np.int64))
                        if spec.dump:
                            _keep_dump(spec, geo, k, {f: res[f][d] for f in DUMP_FIELDS + ("reasons", "warnings")},
                                       dump_parts, out)
                    if nobj:
                        pi = res["par_idx"][d]
                        sel = pi >= 0
                        state.add_pareto(res["par_val"][d][sel].astype(np.float64), base + pi[sel].astype(np.int64))
                        if res["par_rows"][d] > CAP_ROWS:    # more candidate rows: another pass from there
                            queue.append((k, int(res["par_next"][d]), False))
            done_here += sum(geo.chunk(k)[2] * geo.inner for k in ks)
            state.next_chunk = ks[-1] + 1
            if out is not None:
                _write_atomic(state_path, json.dumps(state.to_json(fp, geo)))
            if progress is not None:
                progress(int(state.counts[0]), spec.points, time.perf_counter() - t_start)
        seconds = time.perf_counter() - t_run
        cpu_s = time.process_time() - cpu_run

    names = [n for n, _ in REASONS]
    sign = -1.0 if spec.maximize else 1.0
    signs = [_objective(p, "output.pareto")[1] for p in spec.pareto]
    rows = _rows(spec, np.concatenate([state.top_idx, state.par_idx]),
                 [sign * v for v in state.top_val.tolist()]
                 + [[sg * v for v, sg in zip(row, signs)] for row in state.par_val.tolist()])
    top, pareto = rows[:len(state.top_idx)], rows[len(state.top_idx):]
    dump = None
    if spec.dump and state.next_chunk >= geo.chunks:
        dump = _finish_dump(spec, geo, dump_parts, out)
    result = SweepResult(
        spec=spec, points=spec.points, done=int(state.counts[0]), feasible=int(state.counts[1]),
        infeasible_by_reason={nm: int(c) for nm, c in zip(names, state.counts[2:])},
        seconds=seconds, points_per_s=done_here / seconds if seconds > 0 else 0.0, compile_s=compile_s, cpu_s=cpu_s,
        best=top[0] if top else None, top=top, pareto=pareto, devices=D, chunks=geo.chunks,
        chunk_points=geo.chunk_points, dump=dump)
    if out is not None and result.complete:
        _write_outputs(result, out)
    return result


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


def _flat(row: dict, prefix="") -> dict:
    out = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, list):
            out[prefix + k] = ";".join(str(x) for x in v)
        else:
            out[prefix + k] = v
    return out


def _write_rows_csv(path: Path, rows: list):
    flat = [_flat(r) for r in rows]
    head = list(flat[0]) if flat else ["index"]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=head)
        w.writeheader()
        w.writerows(flat)
    os.replace(tmp, path)
    try:   # Parquet too when pyarrow happens to be installed (not a dependency)
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return
    if flat:
        pq.write_table(pa.Table.from_pylist(flat), str(path.with_suffix(".parquet")))


def _write_outputs(result: SweepResult, out: Path):
    _write_rows_csv(out / "top.csv", result.top)
    if result.spec.pareto:
        _write_rows_csv(out / "pareto.csv", result.pareto)
    _write_atomic(out / "result.json", json.dumps(result.to_json(), indent=1))
