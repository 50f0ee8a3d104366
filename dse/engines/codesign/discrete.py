"""Exact evaluation of allowed points: snapping, discrete polish, exhaustive search.

Every exact evaluation goes through one ``Counter`` (the spec's compiled batch objective,
``compiled.Compiled.exact``), which counts the points it evaluates.
"""

from __future__ import annotations

import itertools

import jax
import numpy as np

from dse.engines.codesign import relax
from dse.engines.codesign.compiled import compiled
from dse.engines.codesign.spec import CLUSTER_VARS, Spec
from dse.engines.host import numpy_mode, to_numpy

__all__ = ["Counter", "log2_values", "box_points", "neighbors", "points", "snap", "polish", "polish_many", "exhaustive", "HW_TRADE"]

# polish: a hardware variable moves up to HW_TRADE levels, alone or while another moves 1 level (a trade
# along a budget line); the network cost is a staircase (whole links and NICs, dse/equations/cost.py), so
# the freed budget sits a NIC rate or an NVLink generation away: up to 12 levels of 64 is a factor 2.
HW_TRADE = 12


def points(spec: Spec, idx):
    """{name: allowed values} of index rows ``idx[n, vars]``."""
    return {v.name: np.asarray(v.values)[idx[:, i]] for i, v in enumerate(spec.free)}


# At most this many points in one exact call run on the host (numpy float64, the same equations:
# dse/backend.py) instead of through an XLA program: compiling the exact objective costs 5-10 CPU s,
# numpy evaluates it at ~10-20 us a point. Snap, polish, the baseline's rounds and the reported
# designs are a few thousand points a call; an exhaustive search goes to XLA beyond this many.
HOST_POINTS = 1 << 16


class Counter:
    """Exact objective of allowed points (inf if infeasible), counting every point evaluated.

    On the host (``host``, the default: snap, polish, the baseline and the reported designs),
    each call is one numpy evaluation of its points. Otherwise points go through in fixed chunks
    of ``chunk`` (the last padded), so one compiled shape serves every call: the exhaustive search
    of a space larger than HOST_POINTS runs the values-only ``Compiled.exact`` in chunks of 2^18
    (its own program, compiled on its own time).
    """

    def __init__(self, spec: Spec, model, cluster, chunk=1024, full=True, host=True):
        self.spec, self.n, self.chunk = spec, 0, int(chunk)
        fn = compiled(spec)
        self.fn = fn.exact_full if full else fn.exact
        self.full, self.host = full, host
        self.args = (model, cluster, np.asarray(float(spec.budget_usd)))

    def _on_host(self, idx, cats, reported):
        with numpy_mode():
            xs = {k: np.asarray(v, dtype=float) for k, v in points(self.spec, idx).items()}
            extra = (reported,) if self.full else ()   # values alone: no network price unless the objective has one
            return self.fn.fun(*to_numpy(self.args), xs, np.asarray(cats, dtype=float), *extra)

    def _chunks(self, idx, cats, reported=False):
        if self.host:
            yield self._on_host(idx, cats, reported)
            return
        n = len(idx)
        size = -(-n // self.chunk) * self.chunk
        if size > n:
            idx = np.concatenate([idx, np.repeat(idx[-1:], size - n, 0)])
            cats = np.concatenate([cats, np.repeat(cats[-1:], size - n, 0)])
        cats = np.asarray(cats, dtype=float)
        for a in range(0, size, self.chunk):
            xs = points(self.spec, idx[a:a + self.chunk])     # host arrays: the Program takes them as they are
            yield self.fn(*self.args, xs, np.asarray(cats[a:a + self.chunk]))

    def __call__(self, idx, cats, count=True):
        n = len(idx)
        self.n += n if count else 0
        if not n:
            return np.zeros(0)
        out = [np.broadcast_to(np.asarray(o[0] if self.full else o), (len(idx) if self.host else self.chunk,))
               for o in self._chunks(idx, cats)]
        return np.concatenate(out)[:n]

    def detail(self, idx, cat):
        """(model, cluster, plan, report, value, cost, feasible) of one allowed point (not counted)."""
        _, tree = next(self._chunks(np.asarray(idx)[None, :], np.asarray(cat, dtype=float)[None, :], reported=True))
        return jax.tree_util.tree_map(lambda a: a[0] if np.ndim(a) else a, tree)


def log2_values(spec: Spec, u):
    """The log2 values z of points u of the box (relax.u_to_z), in numpy on the host (float64): as
    eager jax ops, each op compiled a program of its own in every process (13 compiles, 0.36 CPU-s
    of a warm co-design case)."""
    with numpy_mode():
        return relax.u_to_z(spec, np.asarray(u, np.float64))


def box_points(spec: Spec, z):
    """The points u of the box at log2 values z (relax.z_to_u), in numpy on the host."""
    with numpy_mode():
        return relax.z_to_u(spec, np.asarray(z, np.float64))


def neighbors(spec: Spec, u):
    """Index of the allowed value at or below, and above, each continuous optimum."""
    zs = log2_values(spec, u)
    lo_idx, hi_idx = [], []
    for i, v in enumerate(spec.free):
        vals = np.log2(np.asarray(v.values))
        z = zs[..., i]
        j = np.clip(np.searchsorted(vals, z + 1e-9, side="right") - 1, 0, len(vals) - 1)
        lo_idx.append(j)
        hi_idx.append(np.minimum(j + 1, len(vals) - 1))
    return np.stack(lo_idx, -1), np.stack(hi_idx, -1)


def snap(spec: Spec, u, cats, ev: Counter):
    """Returns (idx, cat, value, start) of the distinct points: corners of the allowed-value cell around each start (at most 2^8 per start; beyond 8
    variables the nearest corner and its one-variable flips), and the low corner with every
    hardware variable 1..HW_TRADE levels lower (a repair toward the cheaper side, where a relaxed
    point sits just past a budget or a cost step)."""
    lo, hi = neighbors(spec, u)
    n = len(spec.free)
    cats = np.asarray(cats)
    if n <= 8:
        masks = np.array(list(itertools.product([0, 1], repeat=n)), dtype=bool)
        idx = np.where(masks[None, :, :], hi[:, None, :], lo[:, None, :]).reshape(-1, n)
        cat = np.repeat(cats, len(masks), axis=0)
        start = np.repeat(np.arange(len(lo)), len(masks))
    else:  # nearest corner of each variable and its one-variable flips
        near = _nearest_mask(spec, u, lo, hi)                   # [starts, n]
        flips = np.vstack([np.zeros((1, n), bool), np.eye(n, dtype=bool)])
        masks = near[:, None, :] ^ flips[None, :, :]            # [starts, n + 1, n]
        idx = np.where(masks, hi[:, None, :], lo[:, None, :]).reshape(-1, n)
        cat = np.repeat(cats, n + 1, axis=0)
        start = np.repeat(np.arange(len(lo)), n + 1)
    hw = np.array([v.name in CLUSTER_VARS for v in spec.free], dtype=int)
    if hw.any():
        down = np.maximum(lo[:, None, :] - hw[None, None, :] * np.arange(1, HW_TRADE + 1)[None, :, None], 0)
        idx = np.concatenate([idx, down.reshape(-1, n)])
        cat = np.concatenate([cat, np.repeat(cats, HW_TRADE, axis=0)])
        start = np.concatenate([start, np.repeat(np.arange(len(lo)), HW_TRADE)])
    return _unique_eval(idx, cat, start, ev)


def _nearest_mask(spec, u, lo, hi):
    zs = log2_values(spec, u)
    out = []
    for i, v in enumerate(spec.free):
        vals = np.log2(np.asarray(v.values))
        z = zs[..., i]
        out.append(np.abs(z - vals[hi[:, i]]) < np.abs(z - vals[lo[:, i]]))
    return np.stack(out, -1)


def _unique_eval(idx, cat, start, ev):
    """Evaluate each distinct point once: (idx, cat, value, the first start that proposed it)."""
    key = np.concatenate([idx, cat], axis=1)
    _, first = np.unique(key, axis=0, return_index=True)
    idx, cat = idx[first], cat[first]
    return idx, cat, ev(idx, cat), start[first]


def _moves(spec: Spec):
    """Polish moves: one allowed value in one variable, or in two (one up, one down, or both;
    two hardware variables trade along a budget line in steps of up to HW_TRADE levels). A
    hardware variable alone also moves up to HW_TRADE levels: its cost is a staircase, so the next
    cheaper (or the next faster) step can be several levels away, with no better point between (the
    gradient's 962.8 GB/s NVLink against the exhaustive optimum's 684.4 in ratio_dense_cost_per_token,
    Llama 3 405B on 32,768: 1.007% apart, every one-level move worse)."""
    n = len(spec.free)
    e = np.eye(n, dtype=int)
    hw = [v.name in CLUSTER_VARS for v in spec.free]
    out = [e[i] * s * f for i in range(n) for s in (-1, 1) for f in (range(1, HW_TRADE + 1) if hw[i] else (1,))]
    for i in range(n):
        for j in range(i + 1, n):
            far = range(1, HW_TRADE + 1) if hw[i] and hw[j] else (1,)
            for a in (-1, 1):
                for b in (-1, 1):
                    out += [e[i] * a + e[j] * b * f for f in far]
                    out += [e[i] * a * f + e[j] * b for f in far if f > 1]
    return np.array(out, dtype=int).reshape(-1, n)


def polish(spec: Spec, idx, cat, val, ev: Counter, max_rounds=50):
    """Discrete local search: the moves of ``_moves`` or any categorical alternative, to the best
    neighbour until no move improves. Returns (idx, cat, value, rounds, stopped_at_limit)."""
    return polish_many(spec, [(idx, cat, val)], ev, max_rounds)[0]


def polish_many(spec: Spec, points, ev: Counter, max_rounds=50):
    """``polish`` of several points ``[(idx, cat, value)]`` at once: each round evaluates the
    neighbours of every point still improving in one call of ``ev`` (a numpy evaluation costs
    ~50 ms a call here whatever its size, so six points polished one by one were 35 calls, 1.2 s
    of a 1.9 s case). Each point takes the path ``polish`` alone takes: its moves and its choice
    depend on its own neighbours only, and the host's elementwise float64 values do not depend
    on the batch. Returns [(idx, cat, value, rounds, stopped_at_limit)] in the order given."""
    _, combos, _ = relax.cat_grid(spec)
    sizes = np.array([len(v.values) for v in spec.free])
    deltas = _moves(spec)
    cur = [(np.asarray(i), np.asarray(c), float(v)) for i, c, v in points]
    out = [None] * len(cur)
    active = list(range(len(cur)))
    for r in range(max_rounds):
        if not active:   # every point settled (or none given)
            break
        moves = []
        for a in active:
            idx, cat, _ = cur[a]
            cand = idx[None, :] + deltas
            cand = cand[np.all((cand >= 0) & (cand < sizes), axis=1)]
            others = [cb for cb in combos if not np.array_equal(cb, cat)]
            mi = np.concatenate([cand, np.repeat(idx[None, :], len(others), 0)])
            mc = np.concatenate([np.repeat(np.asarray(cat)[None, :], len(cand), 0),
                                 np.asarray(others, dtype=float).reshape(len(others), combos.shape[1])])
            moves.append((a, mi, mc))
        counts = [len(mi) for _, mi, _ in moves]
        vals = ev(np.concatenate([m[1] for m in moves]), np.concatenate([m[2] for m in moves]))
        active = []
        for (a, mi, mc), mv in zip(moves, np.split(vals, np.cumsum(counts)[:-1])):
            b = int(np.argmin(mv)) if len(mv) else -1
            if b < 0 or not mv[b] < cur[a][2] * (1 - 1e-12):
                out[a] = cur[a] + (r, False)
                continue
            cur[a] = (mi[b], mc[b], float(mv[b]))
            active.append(a)
    for a in active:
        out[a] = cur[a] + (max_rounds, True)
    return out


def exhaustive(spec: Spec, model, cluster, chunk=1 << 18):
    """Every allowed point, evaluated exactly in chunks. Returns (idx, cat, value, count)."""
    _, combos, _ = relax.cat_grid(spec)
    sizes = [len(v.values) for v in spec.free]
    n_num = int(np.prod(sizes)) if sizes else 1
    total = n_num * len(combos)
    ev = Counter(spec, model, cluster, chunk=chunk, full=False, host=total <= HOST_POINTS)
    best = (None, None, np.inf)
    for start in range(0, total, chunk):
        flat = np.arange(start, min(start + chunk, total))
        ci, ni = np.divmod(flat, n_num)
        idx = np.stack(np.unravel_index(ni, sizes), -1) if sizes else np.zeros((len(flat), 0), int)
        v = ev(idx, combos[ci])
        b = int(np.argmin(v))
        if v[b] < best[2]:
            best = (idx[b], combos[ci][b], float(v[b]))
    return best[0], best[1], best[2], total
