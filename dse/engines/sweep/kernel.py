"""The sweep kernel: evaluate on broadcast axes inside jit, per-chunk reductions (counts, top-K, Pareto)."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from dse import backend
from dse.backend import is_traced, jnp, lax, load_jax, tree_map, x64
from dse.engines.compiled import COMPILE_FIRST, cpu_options
from dse.evaluate import NETWORK_COST_FIGURES, evaluate
from dse.inputs.fidelity import resolve
from dse.inputs import Cluster, ModelShape, Plan, stacks
from dse.report import REASONS, Report
from dse.engines.sweep.spec import CAP_ROWS, CLUSTER_UNITS, DUMP_FIELDS, MODEL_FIELDS, PLAN_FIELDS, SweepSpec, _objective, run_figures
from dse.equations.goodput import RUN_FIGURES


def _inputs(spec: SweepSpec, arrays: dict, dtype):
    """(model, cluster, plan) with the base values, axis arrays substituted (broadcasting)."""
    # concrete values as numpy (no device op a field: 0.2 ms each for a plan built in a Python loop)
    cast = lambda x: jnp.asarray(x, dtype) if is_traced(x) else np.asarray(x, dtype)  # noqa: E731
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
    return ModelShape(**mvals), Cluster(**cvals), stacks.pipelined(Plan(**pvals), dict(spec.pipelined))


def _objective_value(rep: Report, cluster: Cluster, name: str, run: dict | None = None):
    if name in RUN_FIGURES:
        return run_figures(run, rep.tokens_per_s, cluster.gpus)[name]
    return cluster.gpus if name == "gpus" else getattr(rep, name)


# ---------------------------------------------------------------- chunk geometry


# A chunk's fixed work in points: in the 1.13e9-plan sweep's profile (issue 16's benchmark), its
# host side (arguments, results, merges) took 1.1 ms a chunk and the kernel's per-chunk top-K
# (sort and gathers) ~0.8 ms, some 6-9e5 points at 3-5e8 plans/s; 2**19 errs low (it gives up
# a chunk for an even split a little more readily than that profile would).
CHUNK_COST_POINTS = 1 << 19


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
        # The tile (values of the split axis a chunk holds) minimizes the sweep's cost in points:
        # each chunk's points, an odd tile counted as the next even one, plus CHUNK_COST_POINTS a
        # chunk; ties to the least padding, then the fewest tiles. XLA:CPU splits a chunk's
        # fusions over its threads along its first dimension larger than 1, so an odd tile of 3
        # ran as 2 + 1 on two threads (time_to_answer.py's 1.13e9 calibrated plans, loop 3.61-3.70
        # s in tiles of 3, 3.17-3.23 in tiles of 2; one process, load ~1), and 6 values at 5 a
        # tile were a tile of 5 and one of 1 padded to 5 (40% of the points padding). The choice
        # depends on the sizes and chunk_points alone, so a resumed sweep finds the chunks it saved.
        widest = min(sizes[split], max(1, chunk_points // inner))

        def cost(t):
            tiles = -(-sizes[split] // t)
            even = t + (t % 2 if t > 1 else 0)
            return tiles * (even * inner + CHUNK_COST_POINTS), tiles * t, tiles

        tile = min(range(1, widest + 1), key=cost)
        dims = (tile,) + tuple(sizes[split + 1:])
        # a row is the trailing chunk dimensions from ``row_dim`` on (reduced without a reshape)
        row_dim = _row_dim(dims)
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


# ---------------------------------------------------------------- the kernel's axis order

# Network inputs enter only the wire-time terms; the model, the cluster size and the plan
# enter nearly every figure. The kernel's inner loops vary fastest, so only work invariant in
# them is hoisted: the same 8.3M grid ran 7x faster with ``gpus`` outermost (issue 16's profile).
# Measured again here (70.8M plans, reduced, gpus last in the file, load ~11): 0.32 CPU-s with
# gpus moved outermost against 0.21 s in the file's order, so the reordering is off by default
# (REORDER); it is exact either way (tests/engines/test_sweep.py).
REORDER = False
_NETWORK = {"domain", "gpus_per_node", "bw_up_GBps", "bw_out_GBps", "alpha_up_us", "alpha_out_us", "island_gpus",
            "oversubscription", "topology", "torus_x", "torus_y", "torus_z", "torus_bw_x_GBps", "torus_bw_y_GBps",
            "torus_bw_z_GBps", "torus_wrap"}


def _axis_rank(name: str) -> int:
    """0: the model and the cluster size (outermost), 1: plan and compute inputs, 2: the network (innermost)."""
    return 0 if name in ("model", "gpus") or name in MODEL_FIELDS else 2 if name in _NETWORK else 1


def kernel_order(spec: SweepSpec):
    """(spec with its axes in the kernel's order, perm): kernel axis j is the sweep's axis perm[j].

    The sweep's own order unless REORDER, when it already is in this order, for a full dump
    (kept in the sweep's flat order) and for grids of 2^31 points or more (int32 in-chunk keys).
    """
    n = len(spec.axes)
    perm = tuple(sorted(range(n), key=lambda i: (_axis_rank(spec.axes[i].name), i)))
    if not REORDER or perm == tuple(range(n)) or spec.dump or spec.points >= 2**31:
        return spec, tuple(range(n))
    return dataclasses.replace(spec, axes=tuple(spec.axes[i] for i in perm)), perm


# ---------------------------------------------------------------- the device kernel


def _build_kernel(spec: SweepSpec, geo: _Geometry, mesh: Mesh, dtype, cap: int = CAP_ROWS, ostrides=None):
    """A jitted function of a group of chunks (one per device) returning reductions.

    A chunk has one array dimension per chunk axis (the split axis's tile first), so
    XLA computes each sub-expression once per combination of the axes it depends on.
    A row is the trailing dimensions from ``row_dim`` on: a contiguous run of flat
    indices, reduced in place (a reshape of the unmaterialized grid would be slow).
    ``ostrides``: when the kernel's axis order is not the sweep's (``kernel_order``), the
    sweep's flat-index stride of each kernel axis, so top-K ties break by the sweep's index.
    """
    s, dims = geo.split, geo.dims
    r = len(dims)
    G = geo.chunk_points // geo.row
    K = min(spec.top_k, geo.chunk_points)
    objs = [_objective(p, "pareto") for p in spec.pareto]
    sign = -1.0 if spec.maximize else 1.0
    tail = tuple(range(geo.row_dim, r))
    figures, names, dump_names = _figures(spec, geo, dtype)
    # jitted, so it is traced once per shape: the Pareto paths call it twice (the cells' choice from
    # its costs' shapes, then inside the conditional), and the second call reuses the first's
    # jaxpr (SMALL's sweep in tests/engines: trace + lower 1.39 -> 0.82 CPU-s). XLA inlines the
    # call: the same kernel speed and results at 7.1e7 and 1.13e9 plans.
    figures = load_jax().jit(figures)
    kinds = [dtype] * len(names) + [np.int32] + [np.int32 if f in ("reasons", "warnings") else dtype for f in dump_names]
    zeros = lambda *_: tuple(jnp.zeros(dims, k) for k in kinds)  # noqa: E731

    feasible = functools.partial(_feasible, dims=dims)
    cheap = () if dump_names else _network_cells(spec, geo)   # a dump keeps its figures: rows

    def order_key():
        """Each point's index in the sweep's order, when the kernel's axis order is not the sweep's."""
        return None if ostrides is None else _strided_index(dims, ostrides[s:])

    def one(outer_vals, tile_vals, nvalid, skip_below, first, probes):
        # The model once per point: a conditional's results are materialized buffers, so no
        # reduction below can fuse (and recompute) the model. XLA:CPU drops optimization
        # barriers before fusion; with them each of the Pareto pass's full-grid consumers held
        # ~850 ops of the model (issue 16). The predicate is always true, but not to XLA.
        # A plain reduction (top-K and counts) is faster fused: the figures stay unmaterialized.
        figs = (lax.cond(nvalid >= 0, lambda *a: _full(figures(*a), dims), zeros, outer_vals, tile_vals)
                if dump_names else figures(outer_vals, tile_vals))
        vals, reasons, dumped_vals = dict(zip(names, figs)), figs[len(names)], figs[len(names) + 1:]
        valid, feas = feasible(reasons, nvalid)
        cost = lambda name, sg: jnp.broadcast_to(_costs([(vals[name], sg)], feas)[0], dims)  # noqa: E731  infeasible: +inf
        if cheap:   # the K best cells over the network axes hold the K best points
            okey = order_key()
            o = cost(spec.objective, sign)
            cmin, *ckeys = _cell_min(o, _cell_keys(dims, okey), cheap)
            tv, ti = _top_k_cells(o, cmin, ckeys, cheap, dims, first, okey, K)
        else:
            tv, ti = _top_k(cost(spec.objective, sign), first, order_key(), tail, G, geo.row, K)
        out = {"counts": _counts(valid, feas, reasons, dims) * first.astype(jnp.int32), "top_val": tv, "top_idx": ti}
        if objs:   # with a dump: from its materialized figures, costed block by block
            raw = [(vals[nm].reshape(G, geo.row), sg) for nm, sg in objs]
            feas_rows = jnp.broadcast_to(feas, dims).reshape(G, geo.row)
            out.update(_pareto_candidates(raw, feas_rows, probes, skip_below, G, geo.row, cap))
        out.update({f: v.reshape(-1) for f, v in zip(dump_names, dumped_vals)})
        return out

    # A Pareto sweep without cells materializes the model's figures once, each in the shape of the
    # axes it depends on (the reasons and memory of benchmarks/time_to_answer.py's 9.7e5 plans lack
    # the domain axis: a seventh of the chunk), and costs them where they are read: the counts
    # from the reasons alone, the row statistics block by block (_row_form). With each
    # objective's cost materialized over the whole chunk in the conditional, XLA recomputed the
    # reasons' ~300 operations in each of its three full-chunk fusions, and wrote two full-chunk
    # costs for the statistics' loop to read (issue 16). With _pareto_candidates' other changes of
    # this step, loop seconds at 9.7e5 plans 0.0161-0.0169 -> 0.0113-0.0118 (median of 15 runs,
    # three A/B pairs, load ~1.1); 7.1e7 plans 0.387 -> 0.291; the same counts, top-K and fronts.
    need = list(dict.fromkeys([(spec.objective, sign)] + objs))

    def pareto_chunk(outer_vals, tile_vals, nvalid, skip_below, first, probes):
        shapes = load_jax().eval_shape(figures, outer_vals, tile_vals)
        none = lambda *_: tuple(jnp.zeros(x.shape, x.dtype) for x in shapes)  # noqa: E731
        figs = lax.cond(nvalid >= 0, figures, none, outer_vals, tile_vals)
        vals, reasons, valid, feas, cost = _costed(figs, names, need, nvalid, dims)
        tv, ti = _top_k(jnp.broadcast_to(cost[(spec.objective, sign)], dims), first, order_key(), tail, G, geo.row, K)
        out = {"counts": _counts(valid, feas, reasons, dims) * first.astype(jnp.int32), "top_val": tv, "top_idx": ti}
        rows = functools.partial(_row_form, dims=dims, row_dim=geo.row_dim)
        raw = [(rows(vals[nm]), sg) for nm, sg in objs]
        out.update(_pareto_candidates(raw, rows(feas), probes, skip_below, G, geo.row, cap, dims[geo.row_dim:]))
        return out

    # When every objective but one (the lead) and the feasibility are constant over some axes T
    # (the network axes, for step time against memory), a cell of the chunk (the points that
    # differ only along T) holds one candidate at most: its first point at the lead's minimum
    # dominates or duplicates every other point of the cell. One fused reduction of the model
    # over T gives each cell's minimum and its first index; the front is sought among the
    # cells, and the top-K too when the objective is the lead (the K best points lie in the K
    # best cells by (minimum, index)). Nothing of the chunk's size is materialized.
    def pareto(outer_vals, tile_vals, nvalid, skip_below, first, probes):
        vals, reasons, valid, feas, cost = _costed(figures(outer_vals, tile_vals), names, need, nvalid, dims)
        lead, T = _cells(objs, cost, dims)
        if not T:   # the figures again, inside the conditional (those above are dead code)
            return pareto_chunk(outer_vals, tile_vals, nvalid, skip_below, first, probes)
        okey = order_key()
        cmin, *ckeys = _cell_min(jnp.broadcast_to(cost[lead], dims), _cell_keys(dims, okey), T)
        cshape = cmin.shape
        out = {"counts": _counts(valid, feas, reasons, dims) * first.astype(jnp.int32)}
        if (spec.objective, sign) == lead:
            tv, ti = _top_k_cells(jnp.broadcast_to(cost[lead], dims), cmin, ckeys, T, dims, first, okey, K)
        else:
            tv, ti = _top_k(jnp.broadcast_to(cost[(spec.objective, sign)], dims), first, okey, tail, G, geo.row, K)
        out.update(top_val=tv, top_idx=ti)
        gc, rc = _rows_of(cshape)
        raw = [((cmin if o == lead else jnp.broadcast_to(cost[o], cshape)).reshape(gc, rc), 1.0) for o in objs]
        # at most gc rows hold candidates, so a cap of min(cap, gc) is exceeded only where it is cap:
        # the runner's test for another pass (par_rows > cap) holds as it is
        cand = _pareto_candidates(raw, None, probes, skip_below, gc, rc, min(cap, gc))
        pos = cand["par_idx"]                   # a cell's position: its first point at the minimum
        cand["par_idx"] = jnp.where(pos >= 0, ckeys[-1].reshape(-1)[jnp.maximum(pos, 0)], -1)
        out.update(cand)
        return out

    if objs and not dump_names:
        return _sharded(pareto, spec, mesh, set())
    return _sharded(one, spec, mesh, set(dump_names))


def _at(r):
    """``at(j, v)``: a 1-D ``v`` as axis j of a rank-``r`` chunk (a numpy array stays numpy)."""
    return lambda j, v: v.reshape([-1 if i == j else 1 for i in range(r)])


def _feasible(reasons, nvalid, dims):
    """(valid, feasible) points of a chunk, each in the shape of the axes it depends on (a tile's
    padding is not valid; ``reasons`` in its own shape, broadcastable to the chunk's)."""
    valid = _at(len(dims))(0, jnp.arange(dims[0]) < nvalid)
    return valid, valid & (reasons == 0)


def _strided_index(dims, strides):
    """Each point's index sum(coordinate x stride) over a chunk of dimensions ``dims`` (int32,
    broadcast): its flat index in the chunk for the chunk's own strides."""
    at = _at(len(dims))
    return jnp.broadcast_to(sum(at(j, jnp.arange(n, dtype=jnp.int32) * st) for j, (n, st) in enumerate(zip(dims, strides))),
                            dims)


def front_cells(spec: SweepSpec, geo: _Geometry, dtype):
    """(lead objective, axes T) of a Pareto sweep's chunks (``_lead``; T empty: no cells), traced
    abstractly (the kernel decides the same from the shapes of the costs it traces)."""
    jax = load_jax()
    figures, names, _ = _figures(spec, geo, dtype)
    need = [_objective(p, "pareto") for p in spec.pareto]

    costs = lambda ov, tv: _costed(figures(ov, tv), names, need, 1, geo.dims)[-1]  # noqa: E731
    outs = jax.eval_shape(costs, jax.ShapeDtypeStruct((geo.split,), dtype), jax.ShapeDtypeStruct((geo.tile,), dtype))
    return _cells(need, outs, geo.dims)


def _costed(figs, names, need, nvalid, dims):
    """(values by name, reasons, valid, feasible, {(name, sign): cost}) of a chunk's figures, each
    in the shape of the axes it depends on."""
    vals, reasons = dict(zip(names, figs)), figs[len(names)]
    valid, feas = _feasible(reasons, nvalid, dims)
    return vals, reasons, valid, feas, {o: _costs([(vals[o[0]], o[1])], feas)[0] for o in need}


def _cells(objs, cost, dims):
    """(lead objective, axes T) from the shapes of the Pareto objectives' costs (arrays or shape
    structs, each at most of the chunk's rank): ``_lead`` on the chunk axes each depends on."""
    r = len(dims)
    return _lead(objs, {o: (1,) * (r - len(cost[o].shape)) + tuple(cost[o].shape) for o in objs}, dims)


def _strides(dims):
    """The row-major strides of a chunk of dimensions ``dims``."""
    return [math.prod(dims[j + 1:]) for j in range(len(dims))]


# The cell reduction pays only along the chunk's contiguous memory and over cells of some size:
# measured with the packed int64 min (two objectives, step time and memory, load 0.1-1.4, seconds
# of wall time, cells against the materialized path): 1.13e9 plans, T (domain, bw_up, bw_out,
# alpha_out) with the innermost axis, 1,024-point cells: 2.5 against 8.6 (the cells with the
# two-operand reduction); 8.8e6 plans, 64-point cells: 0.051 / 0.10-0.19; 9.7e5 plans, 7-point
# cells: 0.037 / 0.018-0.021; 7.1e7 plans with the innermost axis (gpus) outside T, 64-point
# cells: 0.405 / 0.40.
CELL_POINTS = 64


def _lead(objs, shapes, dims):
    """(lead objective, axes T): the objective whose cells (points differing only along axes over
    which every other objective's cost is constant) are the largest; T empty when none holds
    CELL_POINTS points or T does not hold the chunk's innermost axis (size > 1)."""
    best = (None, ())
    for o in objs:
        T = tuple(a for a in range(len(dims)) if dims[a] > 1 and all(shapes[q][a] == 1 for q in objs if q != o))
        if math.prod(dims[a] for a in T) > math.prod(dims[a] for a in best[1]):
            best = (o, T)
    return best if _cells_pay(best[1], dims) else (None, ())


def _cells_pay(T, dims):
    """Whether cells over axes T pay: they hold the chunk's innermost axis (size > 1) and
    CELL_POINTS points or more (the reduction pays only along contiguous memory)."""
    inner = max((a for a in range(len(dims)) if dims[a] > 1), default=None)
    return inner in T and math.prod(dims[a] for a in T) >= CELL_POINTS


def _cell_keys(dims, okey):
    """The keys a cell's first point at its minimum is found by: its flat index in the chunk,
    after its index in the sweep's order when the kernel's order differs (``okey``)."""
    flat = _strided_index(dims, _strides(dims))
    return (flat,) if okey is None else (okey, flat)


def _network_cells(spec: SweepSpec, geo: _Geometry):
    """Axes T of a chunk over which a plain reduction takes its top-K by cells (``_cell_min``,
    ``_top_k_cells``): the network axes (``_axis_rank`` 2), when cells over them pay
    (``_cells_pay``); else () and rows (``_top_k``).

    The K best points lie in the K best cells by (minimum, index) for any cells, and a fused
    reduction whose inner loop runs over the network alone leaves the rest of the model
    (everything the plan and the cluster size set) invariant in it: 1.13e9 plans, the top-K over
    rows of (gpus, bw_out, alpha_out) took 7.1 ms a chunk in the model's fusion, over cells of
    (domain, bw_up, bw_out, alpha_out) 4.5 ms (jax.profiler, 24 chunks, load ~1)."""
    names = [a.name for a in spec.axes[geo.split:]]
    dims = geo.dims
    T = tuple(a for a, (name, n) in enumerate(zip(names, dims)) if n > 1 and _axis_rank(name) == 2)
    return T if _cells_pay(T, dims) else ()


def _cell_min(o, keys, T):
    """Each cell's (minimum, keys of its first point at the minimum) over axes ``T``, by
    (value, keys[0]) (NaN as +inf); the results keep the chunk's rank (size 1 on ``T``)."""
    big = jnp.iinfo(jnp.int32).max
    o = jnp.where(jnp.isnan(o), jnp.asarray(jnp.inf, o.dtype), o)

    def better(a, b):
        take = (a[0] < b[0]) | ((a[0] == b[0]) & (a[1] < b[1]))
        return tuple(jnp.where(take, x, y) for x, y in zip(a, b))

    cshape = tuple(1 if a in T else n for a, n in enumerate(o.shape))
    if o.dtype == jnp.float32 and len(keys) == 1:
        # one int64 a point, ordered as (value, index): a plain min, which XLA:CPU vectorizes, where
        # the two-operand reduction does not (1.13e9 plans with a two-objective front, load 0.1:
        # 8.6 -> 2.5 s of wall time, the same front and top-K; issue 16). A float32 sweep traces
        # with x64 off, so the keys' 64 bits are enabled here alone.
        with x64(True):
            m = jnp.min(_pack(o, keys[0]), axis=T)
            return tuple(x.reshape(cshape) for x in _unpack(m))
    inits = (jnp.asarray(jnp.inf, o.dtype),) + tuple(jnp.int32(big) for _ in keys)
    res = lax.reduce((o,) + tuple(keys), inits, better, T)
    return tuple(x.reshape(cshape) for x in res)


_LOW = 0x7FFFFFFF


def _pack(v, idx):
    """float32 values and int32 indices (>= 0) as int64 keys whose order is (value, index): the
    value's bits in the high word, mapped so that signed integer order is float order (-0 as +0).
    -0 becomes +0 on the bits: XLA folds a ``v + 0`` away, and under FLOAT32_OPTIONS (no signed
    zeros) LLVM may fold a float ``where(v == 0, 0, v)`` to ``v``; integer operations it keeps."""
    return (_ordered(v).astype(jnp.int64) << 32) | idx.astype(jnp.int64)


def _ordered(v):
    """float32 ``v``'s bits as int32 whose signed order is the values' order (-0 as +0)."""
    bits = lax.bitcast_convert_type(v, jnp.int32)
    bits = jnp.where(bits == jnp.iinfo(jnp.int32).min, 0, bits)     # -0.0's bits (0x80000000) as +0.0's
    return jnp.where(bits >= 0, bits, bits ^ _LOW)


def _from_ordered(ordered):
    """The float32 values of ``_ordered``'s integers."""
    return lax.bitcast_convert_type(jnp.where(ordered >= 0, ordered, ordered ^ _LOW), jnp.float32)


def _pair(a, b):
    """float32 pairs (a, b) as int64 keys in the order of (a, b): ``_pack``'s high word for a, the
    same map of b's bits in the low word, its sign bit flipped (unsigned order there)."""
    low = (_ordered(b) ^ jnp.iinfo(jnp.int32).min).astype(jnp.int64) & 0xFFFFFFFF
    return (_ordered(a).astype(jnp.int64) << 32) | low


def _unpair(key):
    """(a, b) of ``_pair``'s keys."""
    low = (key & 0xFFFFFFFF).astype(jnp.uint32).astype(jnp.int32) ^ jnp.iinfo(jnp.int32).min
    return _from_ordered((key >> 32).astype(jnp.int32)), _from_ordered(low)


def _unpack(key):
    """(value, index) of ``_pack``'s keys."""
    return _from_ordered((key >> 32).astype(jnp.int32)), (key & 0xFFFFFFFF).astype(jnp.int32)


# XLA:CPU options of a float32 sweep kernel: LLVM's fast-math flags less the ones that change what
# a result means (NaN and infinity kept: infeasible plans are +inf and a NaN objective is skipped;
# division and library functions exact). What is left lets LLVM reassociate and contract float
# arithmetic and ignore the sign of zero, so the kernel's loops and min-reductions vectorize.
# The ranking values move by float32 rounding (contraction into FMAs: at most 1.3e-7 relative on
# the top rows below); the reported rows are re-evaluated in float64 on the host either way. On
# llama3-405b-h100.toml, llama3-405b-16k.toml and benchmarks/time_to_answer.py's 9.7e5 (step time
# and MFU) and 7.1e7 Pareto sweeps: the same counts, top-K and fronts; loop seconds 0.092 -> 0.020,
# 0.054 -> 0.054, 0.027 -> 0.024 and 0.039 -> 0.024, 0.67 -> 0.43 (one process each, load ~1.2);
# benchmarks/time_to_answer.py --big, 1.13e9 plans: reduced 5.4-5.9 s (two runs, round 12) -> 3.6-4.8
# s (three runs, load 1.0-1.4: 2.4-3.2e8 plans/s), Pareto 5.2-5.9 -> 3.9-6.2 s. A float64 sweep and
# other devices keep XLA's defaults (a float64 sweep's values are the host's bit for bit:
# tests/engines/test_compiled.py).
# The kernel's fusions are emitted by XLA:CPU's classic LLVM emitters, not its MLIR fusion emitters
# (xla_cpu_use_fusion_emitters): building the kernel takes 10-29% less CPU time (its XLA compile
# alone about half on the main job), and the loop keeps its speed within 0-10%, so sweeps up to a few
# billion plans get their answer sooner. Measured in one process each at load ~1 (build = trace +
# lower + XLA compile, CPU-s; loops: two runs, wall s): the main job
# (138,240 plans, Pareto) 9.6 -> 6.8 CPU-s, loops 0.012-0.018 -> 0.011-0.024 s; llama3-405b-16k.toml
# 8.9 -> 7.4, 0.037-0.051 -> 0.039-0.042; 9.7e5 reduced 5.8 -> 4.3; 9.7e5 Pareto 8.1 -> 6.8;
# 7.1e7 Pareto 9.3 -> 6.8, 0.38-0.42 -> 0.39-0.41; 7.1e7 reduced 6.1 -> 4.7, 0.208 -> 0.23;
# 1.13e9 reduced 5.4 -> 4.7-4.9, loop 3.14-3.15 -> 3.24-3.32 s (3.6e8 -> 3.4-3.5e8 plans/s). The same
# counts, top-K and fronts on all of them. (Co-design's float64 exact program keeps the MLIR
# emitters: there its loop ran 36% slower for 18% less compile.)
FLOAT32_OPTIONS = {"xla_cpu_enable_fast_math": True, "xla_cpu_fast_math_honor_nans": True,
                   "xla_cpu_fast_math_honor_infs": True, "xla_cpu_fast_math_honor_division": True,
                   "xla_cpu_fast_math_honor_functions": True, "xla_cpu_use_fusion_emitters": False}


# A sweep of at most FIRST_POINTS plans is compiled for its compile time (COMPILE_FIRST: LLVM at O0,
# XLA:CPU's classic emitters): its loop is milliseconds whatever the code, its compile is what the user
# waits for. The test suite's 512-plan Pareto kernel: XLA compile 1.69 -> 0.89 CPU-s; seven of
# test_sweep's kernels, cold, two A/B pairs: 38.7-39.0 -> 29.4-30.1 CPU-s. Bigger sweeps
# keep the fast code: at 967,680 plans the compile was no shorter (4.75 vs 4.68 s) and the loop 20x
# slower (0.012 -> 0.240 s); at 65,536 plans that loop is ~16 ms.
FIRST_POINTS = 1 << 16


def compile_options(dtype, platform: str, points: int | None = None) -> dict:
    """The XLA options a sweep kernel of ``dtype`` over ``points`` plans compiles with on ``platform``
    (FLOAT32_OPTIONS for float32 on the CPU, with COMPILE_FIRST up to FIRST_POINTS plans; XLA's
    defaults elsewhere)."""
    options = dict(FLOAT32_OPTIONS) if np.dtype(dtype) == np.float32 else {}
    if points is not None and points <= FIRST_POINTS:
        options.update(COMPILE_FIRST)
    return cpu_options(options, platform) or {}


def _row_dim(shape):
    """Where a row starts: the last dimension from which the trailing ones hold 128 values or more."""
    return next((j for j in reversed(range(1, len(shape))) if math.prod(shape[j:]) >= 128), 0)


def _rows_of(shape):
    """(rows, row length) of an array of ``shape``: its trailing dimensions from ``_row_dim`` on."""
    rc = math.prod(shape[_row_dim(shape):])
    return math.prod(shape) // rc, rc


def _top_k_cells(o, cmin, ckeys, T, dims, first, okey, K):
    """The K best points of a chunk by (value, index) from its cells' minima (``_cell_min``):
    the K best cells by (minimum, key of its first point there) hold them; their points are
    evaluated again (a gather of ``o``, fused with the model) and sorted."""
    nc = cmin.size
    cv = jnp.where(first, cmin.reshape(-1), jnp.inf)
    cshape = cmin.shape
    strides = _strides(dims)
    if okey is None and cv.dtype == jnp.float32:
        # by (minimum, flat index of the cell's first point there) in one packed key: a cell's own
        # index follows from that point's coordinates off T
        _, pts = _sort_by_value(cv, ckeys[0].reshape(-1))
        pts = pts[:min(K, nc)]
        cst = _strides(cshape)
        cells = functools.reduce(jnp.add, [(pts // strides[a]) % dims[a] * cst[a] for a in range(len(dims))
                                           if a not in T], jnp.zeros_like(pts))
    else:
        _, _, cells = lax.sort((cv, ckeys[0].reshape(-1), jnp.arange(nc, dtype=jnp.int32)), num_keys=2)
        cells = cells[:min(K, nc)]
    base = np.zeros(cshape, np.int64)        # a cell's first point, and the offsets of its points along T
    offs = np.zeros([dims[a] if a in T else 1 for a in range(len(dims))], np.int64)
    for a, n in enumerate(dims):
        col = np.arange(n).reshape([-1 if i == a else 1 for i in range(len(dims))]) * strides[a]
        if a in T:
            offs = offs + col
        else:
            base = base + col
    pidx = (jnp.asarray(base.reshape(-1).astype(np.int32))[cells][:, None]
            + jnp.asarray(offs.reshape(-1).astype(np.int32))[None, :]).reshape(-1)
    cand = o.reshape(-1)[pidx]
    cand = jnp.where(first & ~jnp.isnan(cand), cand, jnp.inf)
    if okey is None:
        tv, ti = _sort_by_value(cand, pidx)
    else:
        tv, _, ti = lax.sort((cand, okey.reshape(-1)[pidx], pidx), num_keys=2)
    return tv[:K], ti[:K]


def _figures(spec: SweepSpec, geo: _Geometry, dtype):
    """(figures(outer values, tile values), objective names, dump names): the model on a chunk,
    every figure the reductions need, each in the shape of the axes it depends on (broadcastable
    to the chunk's dimensions; ``_full`` broadcasts them)."""
    fid = tree_map(lambda x: np.asarray(x, dtype), resolve(spec.fidelity))   # constants: numpy (backend.folding)
    axes, s, dims = spec.axes, geo.split, geo.dims
    at = _at(len(dims))
    # Inner axes' values are constants of the program. Up to backend.FOLD_SIZE points they are given as
    # numpy, so what ``evaluate`` works out from them and the model alone is computed once on the
    # host (backend.folding), not staged, lowered and compiled: the test sweeps' kernels trace
    # 7,124 -> 2,965 top-level equations. Above it they are staged as jax values: a folded
    # constant the size of a big chunk's inner block is read from memory for every chunk, and the
    # 1.13e9-plan reduced sweep ran 3.96 -> 5.18 s with its inner axes folded.
    fold = geo.inner <= backend.FOLD_SIZE
    inner = {a.name: at(j, np.asarray(a.values, dtype)) for j, a in enumerate(axes[s + 1:], start=1)}
    names = list(dict.fromkeys([spec.objective] + list(spec.pareto)))
    dump_names = DUMP_FIELDS + ("reasons", "warnings") if spec.dump else ()
    priced = bool(set(NETWORK_COST_FIGURES) & set(names + list(dump_names)))   # else no price model is traced

    def figures(outer_vals, tile_vals):
        arrays = {a.name: outer_vals[i] for i, a in enumerate(axes[:s])}
        arrays[axes[s].name] = at(0, tile_vals)
        arrays.update({name: v if fold else jnp.asarray(v) for name, v in inner.items()})
        model, cluster, plan = _inputs(spec, arrays, dtype)
        rep = evaluate(model, cluster, plan, fid, network_cost=priced)
        out = [jnp.asarray(_objective_value(rep, cluster, nm, spec.run_dict), dtype) for nm in names] + [rep.reasons]
        out += [jnp.asarray(getattr(rep, f), jnp.int32 if f in ("reasons", "warnings") else dtype) for f in dump_names]
        return tuple(jnp.asarray(v) for v in out)

    return figures, names, dump_names


def _full(figs, dims):
    """Figures broadcast to the chunk's dimensions."""
    return tuple(jnp.broadcast_to(v, dims) for v in figs)


def _counts(valid, feas, reasons, dims):
    """Points, feasible points, and points per reason bit (REASONS) of a chunk.

    Each count is taken over the axes its operands depend on and scaled by the chunk points
    each of those stands for: the reasons depend on fewer axes than the chunk has (most not on
    the network), and 13 sums of their broadcast over the chunk were each a pass of the
    reasons' expression over every point (issue 16)."""
    reasons = jnp.asarray(reasons)
    shape = jnp.broadcast_shapes(jnp.shape(valid), jnp.shape(reasons))
    mult = math.prod(dims) // math.prod(shape)
    valid = jnp.broadcast_to(valid, shape)
    bits = ((reasons[..., None] >> jnp.arange(len(REASONS), dtype=reasons.dtype)) & 1) == 1
    cnt = jnp.concatenate([jnp.stack([jnp.sum(valid, dtype=jnp.int32), jnp.sum(feas, dtype=jnp.int32)]),
                           jnp.sum(valid[..., None] & bits, axis=tuple(range(len(shape))), dtype=jnp.int32)])
    return cnt * mult


def _sharded(one, spec: SweepSpec, mesh: Mesh, dumped: set):
    """``one`` (a chunk) over a group of chunks, one per device of ``mesh``, jitted."""
    jax = load_jax()
    from jax.sharding import PartitionSpec as P

    def group(outer_vals, tile_vals, nvalid, skip_below, first, probes):
        res = one(outer_vals[0], tile_vals[0], nvalid[0], skip_below[0], first[0], probes)
        # reductions are gathered onto every device, so every process (host) can read them;
        # a dump stays where it was computed
        return {k: v[None] if k in dumped else lax.all_gather(v, "d") for k, v in res.items()}

    out_keys = ["counts", "top_val", "top_idx"] + (["par_val", "par_idx", "par_rows", "par_next"] if spec.pareto else [])
    out_keys += sorted(dumped)
    spec_d = P("d")
    fn = jax.shard_map(group, mesh=mesh, in_specs=(spec_d, spec_d, spec_d, spec_d, spec_d, P()),
                       out_specs={k: spec_d if k in dumped else P() for k in out_keys}, check_vma=False)
    return jax.jit(fn)


def _top_k(o, first, okey, tail, G, R, K):
    """The K best points of a chunk by (value, index): the K best rows by (row min, first index
    at it), then a sort of those rows. ``okey``: each point's index in the sweep's order
    (None: the chunk's own order is the sweep's). Extra Pareto passes (``first`` False) add
    nothing; a row whose minimum is NaN (an undefined objective) is skipped (nanmin costs 5x)."""
    rowmin = jnp.min(o, axis=tail).reshape(G)
    rowmin = jnp.where(first & ~jnp.isnan(rowmin), rowmin, jnp.inf)
    ids = jnp.arange(G, dtype=jnp.int32)
    if okey is None:
        _, rows = _sort_by_value(rowmin, ids)
    else:
        at_min = o == jnp.min(o, axis=tail, keepdims=True)
        rowkey = jnp.min(jnp.where(at_min, okey, jnp.iinfo(jnp.int32).max), axis=tail).reshape(G)
        _, _, rows = lax.sort((rowmin, rowkey, ids), num_keys=2)
    rows = rows[:min(K, G)]
    cand = o.reshape(G, R)[rows].reshape(-1)
    cand = jnp.where(first & ~jnp.isnan(cand), cand, jnp.inf)
    cidx = (rows[:, None] * R + jnp.arange(R, dtype=jnp.int32)[None, :]).reshape(-1)
    if okey is None:
        tv, ti = _sort_by_value(cand, cidx)
    else:
        tv, _, ti = lax.sort((cand, okey.reshape(G, R)[rows].reshape(-1), cidx), num_keys=2)
    return tv[:K], ti[:K]


def _sort_by_value(v, idx):
    """(v, idx) sorted by (value, index), ``idx`` >= 0. float32 values and int32 indices are sorted
    as one int64 key a point (``_pack``): XLA:CPU sorts a lone integer operand by plain comparisons
    and any other sort through a comparator call per comparison (12,544 points, alone: 2.9 ms as a
    two-key float sort, 0.54 ms packed). -0 sorts as +0, as the host merges compare it."""
    if v.dtype == jnp.float32 and idx.dtype == jnp.int32:
        with x64(True):
            return _unpack(lax.sort(_pack(v, idx)))
    return lax.sort((v, idx), num_keys=2)


def _costs(raw, feas):
    """Each objective as the reductions minimize it: sign x value, +inf where infeasible
    (``feas`` None: ``raw`` is costed already, its infeasible points +inf)."""
    if feas is None:
        return [v if sg == 1.0 else sg * v for v, sg in raw]
    pen = jnp.where(feas, jnp.asarray(0, raw[0][0].dtype), jnp.asarray(jnp.inf, raw[0][0].dtype))
    return [sg * v + pen for v, sg in raw]


def _row_form(x, dims, row_dim):
    """A figure of a chunk of dimensions ``dims`` (broadcastable to them) as rows: (G, its own
    trailing dimensions from ``row_dim`` on), each row's leading coordinates in one dimension; a
    reshape, no copy, when the figure depends on every leading axis."""
    x = jnp.asarray(x)
    sh = (1,) * (len(dims) - x.ndim) + tuple(x.shape)
    lead = tuple(dims[:row_dim])
    return jnp.broadcast_to(x.reshape(sh), lead + sh[row_dim:]).reshape((math.prod(lead),) + sh[row_dim:])


def _least(raw, feas):
    """``raw`` (figure, sign) each reduced by its minimum in the cost order over the axes of a row
    that it depends on and ``feas`` does not: the row minima of ``_costs(raw, feas)`` are those of
    ``_costs(_least(raw, feas), feas)``, and the plain reduction runs before the penalty is
    broadcast (7.1e7 plans: the step time's row minima with the penalty fused in took 3.8 ms a
    chunk, four times the plain minimum of the materialized cost)."""
    if feas is None:
        return raw
    out = []
    for v, sg in raw:
        axes = tuple(a for a in range(1, v.ndim) if feas.shape[a] == 1 and v.shape[a] > 1)
        out.append((sg * jnp.min(sg * v, axis=axes, keepdims=True) if axes else v, sg))
    return out


def _pareto_candidates(raw, feas, probes, skip_below, G, R, cap, cols=None):
    """Up to ``cap`` rows (from ``skip_below`` on) holding a point no known point dominates.

    ``raw``: (figure, sign) per objective, ``feas``: feasible points (None: ``raw`` is costed),
    each (G, R) or in ``_row_form`` (G, trailing dimensions broadcastable to ``cols``)."""
    cols = (R,) if cols is None else tuple(cols)
    tail = tuple(range(1, 1 + len(cols)))
    mine = jnp.arange(G, dtype=jnp.int32) >= skip_below // R
    # Without probes (a sweep's first chunk: the front so far is empty) the row statistics decide
    # (exact ideals, and each row's lexicographic minima as known points, so that a chunk's own
    # front prunes it). With probes, a first test from each row's plain minima over all its points:
    # they bound its real points' minima from below (a NaN keeps the row), so a probe that
    # strictly dominates them dominates every point of the row; when the probes leave rows of at
    # most FEW_POINTS points, those are the candidates, otherwise the statistics prune further.
    def probed():
        lo = jnp.stack([jnp.min(jnp.broadcast_to(f, (G,) + cols), axis=tail) for f in _costs(_least(raw, feas), feas)], axis=-1)
        return mine & ~jnp.any(lo == jnp.inf, axis=-1) & ~_rows_dominated(lo, [], probes)

    def exact(maybe):
        anyreal, ideal, lex = _row_stats(raw, feas, G, cols)
        return maybe & anyreal & ~_rows_dominated(ideal, lex, probes)

    none = jnp.all(probes == jnp.inf)
    maybe = lax.cond(none, lambda: mine, probed)
    rowok = lax.cond(none | (jnp.sum(maybe) > min(max(1, FEW_POINTS // R), cap)), exact, lambda m: m, maybe)
    (crow,) = jnp.nonzero(rowok, size=cap, fill_value=G)
    crow_c = jnp.minimum(crow, G - 1)
    # the candidate rows only, in the rows' own shape (cap, cols): flattened by the host, since a
    # fusion whose result is reshaped indexes its operands point by point (9.7e5 plans, 512 rows
    # of 168 points: 1.2 ms of thread time a figure as (cap x 168), 0.1 as (cap, 4, 3, 2, 7))
    Fs = [jnp.broadcast_to(f, (cap,) + cols) for f in _costs([(v[crow_c], sg) for v, sg in raw], None if feas is None else feas[crow_c])]
    real = functools.reduce(jnp.logical_and, [jnp.isfinite(f) for f in Fs])
    at_row = lambda x: x.reshape((cap,) + (1,) * len(cols))  # noqa: E731
    pok = real & at_row(crow < G)
    return {"par_val": jnp.stack(Fs, axis=-1),
            "par_idx": jnp.where(pok, at_row(crow_c) * R + jnp.arange(R, dtype=jnp.int32).reshape(cols), -1),
            "par_rows": jnp.sum(rowok, dtype=jnp.int32),
            "par_next": (crow_c[-1] + 1) * R}


# Points a block of the row statistics holds: a block's k objectives stay in the CPU's cache while
# the statistics' several passes read them; over the whole chunk each pass went to memory (issue
# 16: the Pareto pass ran at ~20% of the plain reduction). Counted in points, not rows: a block of
# 16 rows was 2,688 points at 168 a row, and each block's loop step cost more than its work (8192
# blocks x 2 objectives, float32, ns a point: rows of 168: 5.0 at 16 rows, 1.39 at 32,768 points;
# of 128: 1.5 / 1.1; of 512: 1.3 / 1.0; of 2048: 1.4 at either).
STATS_BLOCK_POINTS = 32768
# Candidate points a chunk may send the host without the row statistics: when the probes alone
# leave rows of at most this many points, those rows are the candidates (the host's exact merge
# takes them: 65,536 points are 128 rows of 512). 7.1e7 plans, load ~1, seconds of the loop (first
# run / a second): always the statistics 0.235 / 0.213-0.220; at 65,536 points 0.194 / 0.167-0.172
# (reduced 0.11 / 0.095-0.106); the fronts and top-K at 1e6-1e9 byte for byte the same.
FEW_POINTS = 65536


def _row_stats(raw, feas, G, cols):
    """Per row of the objectives (``raw`` and ``feas`` as ``_pareto_candidates`` takes them, rows of
    ``cols`` points, costed by ``_costs``): whether it has a real (finite) point, its ideal
    point (the minimum in each objective over its real points) and, for each objective j, its
    lexicographic minimum with j first: (any (G,), ideal (G, k), [lex_j (G, k)]).

    Every statistic is row-local, so rows are taken in blocks (``lax.map`` over slices of the
    arrays, no copy of them): the largest divisor of G up to STATS_BLOCK_POINTS // R rows. A block
    keeps the rows' own shape (rows, cols), never flattened to (rows, R): a fusion reshaping
    its operands indexes them point by point (the block loop of 9.7e5 plans: 17 ms of thread time
    flattened, 1.6 as it is)."""
    k, R = len(raw), math.prod(cols)
    rb = max(d for d in range(1, min(max(1, STATS_BLOCK_POINTS // R), G) + 1) if G % d == 0)

    def one(i):
        cut = lambda x: lax.dynamic_slice_in_dim(x, i * rb, rb, axis=0)  # noqa: E731
        fs = _costs([(cut(v), sg) for v, sg in raw], None if feas is None else cut(feas))
        real = functools.reduce(jnp.logical_and, [jnp.isfinite(f) for f in fs])
        inf = jnp.asarray(jnp.inf, fs[0].dtype)
        ws = [jnp.where(real, f, inf) for f in fs]     # each objective at the real points, +inf elsewhere
        lex = _lexmins(ws)
        return jnp.isfinite(lex[0][:, 0]), lex   # a row's least first objective is finite: a real point

    anyreal, lex = lax.map(one, jnp.arange(G // rb, dtype=jnp.int32))
    lex = jnp.moveaxis(lex, 1, 0).reshape(k, G, k)                       # small: (k, G, k)
    # the ideal's objective j is the first (minimized) component of the minimum with j first
    ideal = jnp.stack([lex[j][:, j] for j in range(k)], axis=-1)
    return anyreal.reshape(G), ideal, [lex[j] for j in range(k)]


def _lexmins(ws):
    """Per row of a block, its lexicographic minimum with each objective first, (k, rows, k) (each
    in the objectives' order). ``ws``: each objective at the row's real points, +inf elsewhere, (rows,
    the row's own trailing shape). Two float32 objectives: each minimum is one min of int64 keys
    packing the pair (``_pair``), which XLA:CPU vectorizes; otherwise ``_lexmin_rows``."""
    k, tail = len(ws), tuple(range(1, ws[0].ndim))
    if k == 2 and ws[0].dtype == jnp.float32:
        out = []
        for j in range(2):
            with x64(True):
                first, second = _unpair(jnp.min(_pair(ws[j], ws[1 - j]), axis=tail))
            out.append(jnp.stack([first, second] if j == 0 else [second, first], axis=-1))
        return jnp.stack(out)
    mins = [jnp.min(w, axis=tail, keepdims=True) for w in ws]
    return jnp.stack([_lexmin_rows(ws, mins, j) for j in range(k)])


def _lexmin_rows(ws, mins, first):
    """Per row of a block, the lexicographic minimum with objective ``first`` first, (rows, k).

    ``ws``: each objective at the row's real points, +inf elsewhere; ``mins``: their row minima
    (keepdims). ``ws[first] == mins[first]`` marks the real points at the first minimum (every
    point of a row without a real one, whose components then all stay +inf), so no separate
    mask of the real points is read again (3 fused passes over a block instead of 7)."""
    k, tail = len(ws), tuple(range(1, ws[0].ndim))
    mask = ws[first] == mins[first]
    vals = [None] * k
    vals[first] = mins[first].reshape(-1)
    for i in [i for i in range(k) if i != first]:
        m = jnp.min(jnp.where(mask, ws[i], jnp.inf), axis=tail, keepdims=True)
        mask = mask & (ws[i] == m)
        vals[i] = m.reshape(-1)
    return jnp.stack(vals, axis=-1)


def _rows_dominated(ideal, lex, probes):
    """Rows whose every point some known point strictly dominates (safe: only real points prune).

    A row's ideal point (its minimum in each objective, ``ideal`` (G, k)) lower-bounds its
    points; when a known point strictly dominates the ideal, it strictly dominates the whole
    row (any lower bound of its real points serves). Known points: ``probes`` (the front so far)
    and each row's lexicographic minima (``lex``, one (G, k) array per objective first; [] for
    the probes alone). Two objectives: exact test against all of
    them through the sorted staircase; three: against the probes and the chunk's lexicographic
    minima.
    """
    k = ideal.shape[-1]
    inf = jnp.asarray(jnp.inf, ideal.dtype)
    if k == 2:
        known = jnp.concatenate([probes] + list(lex), axis=0)
        # the staircase needs the known points in order of q1 alone (ties in any order: a prefix
        # ends before or after a whole tie)
        q1, order = _sort_by_value(known[:, 0], jnp.arange(known.shape[0], dtype=jnp.int32))
        q2 = known[order, 1]
        best2 = lax.associative_scan(jnp.minimum, q2)          # min f2 over q1 <= sorted position
        a1, a2 = ideal[:, 0], ideal[:, 1]
        le = jnp.searchsorted(q1, a1, side="right")                 # known points with q1 <= a1
        lt = jnp.searchsorted(q1, a1, side="left")                  # known points with q1 < a1
        g_le = jnp.where(le > 0, best2[jnp.maximum(le - 1, 0)], inf)
        g_lt = jnp.where(lt > 0, best2[jnp.maximum(lt - 1, 0)], inf)
        return (g_le < a2) | (g_lt <= a2)
    pts = []
    for j, x in enumerate(lex):   # the chunk's lexicographic minimum with objective j first
        order = [j] + [i for i in range(k) if i != j]
        out = lax.sort(tuple(x[:, i] for i in order) + tuple(x[:, i] for i in range(k)), num_keys=k)
        pts.append(jnp.stack([v[0] for v in out[k:]]))
    known = jnp.concatenate([probes, jnp.stack(pts)], axis=0) if pts else probes
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
    if k == 2:
        # In the order (f1, f2, index) a point survives when its f2 beats every earlier f2: of the
        # points sharing an f1 only the least by (f2, index) can, when its f2 beats every smaller
        # f1's. One sort by f1 and a reduction per group of equal f1 (a three-key lexsort of the
        # 10,360 candidates of the 9.7e5-plan sweep's chunk took 2.1-3.0 ms, this 0.5-0.7).
        o = np.argsort(values[:, 0])
        f1, f2, ids = values[o, 0], values[o, 1], index[o]
        start = np.flatnonzero(np.concatenate([[True], f1[1:] != f1[:-1]]))
        g2 = np.minimum.reduceat(f2, start)
        size = np.diff(np.concatenate([start, [n]]))
        at2 = f2 == np.repeat(g2, size)
        big = np.iinfo(np.int64).max
        gid = np.minimum.reduceat(np.where(at2, ids, big), start)
        first = np.minimum.reduceat(np.where(at2 & (ids == np.repeat(gid, size)), o, n), start)   # equal points: the first given
        before = np.concatenate([[np.inf], np.minimum.accumulate(g2)[:-1]])
        keep[first[g2 < before]] = True
        return keep
    order = np.lexsort((index,) + tuple(values[:, j] for j in reversed(range(k))))
    # general k: sweep in sorted order, test each point against the front kept so far
    front = np.empty((0, k))
    for i in order:
        v = values[i]
        if front.shape[0] and np.any(np.all(front <= v, axis=1)):
            continue   # an earlier point (in lexicographic order) covers it
        keep[i] = True
        front = np.vstack([front, v])
    return keep
