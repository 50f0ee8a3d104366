"""The sweep kernel: evaluate on broadcast axes inside jit, per-chunk reductions (counts, top-K, Pareto)."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from dse.evaluate import evaluate
from dse.inputs.fidelity import resolve
from dse.inputs import Cluster, ModelShape, Plan
from dse.report import REASONS, Report
from dse.engines.sweep.spec import CAP_ROWS, CLUSTER_UNITS, DUMP_FIELDS, MODEL_FIELDS, PLAN_FIELDS, PROBES, SweepSpec, _objective, run_figures
from dse.equations.goodput import RUN_FIGURES


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


def _objective_value(rep: Report, cluster: Cluster, name: str, run: dict | None = None):
    if name in RUN_FIGURES:
        return run_figures(run, rep.tokens_per_s, cluster.gpus)[name]
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
            return bar(sg * _objective_value(rep, cluster, name, spec.run_dict) + pen)

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
