"""Suggest a plan the way the seeds tell an engineer to, and measure it against the best one.

Two procedures, each a walk over one table of evaluated plans:

- seed 000 sec.7 (Narayanan et al.'s takeaways): t the smallest power of two up to the
  scale-up domain that makes a layer's state fit; p as memory forces (ZeRO-1, then
  -2); d = N/(t p) with m >> p, else interleave; tune b and recomputation (every mode of
  plan.RECOMPUTE, and full recompute of every other layer); for MoE,
  e so the experts fit and the all-to-all stays in the domain.
- seed 001's default: t = GPUs per node and never more, p only as large as memory
  forces, m >= 4p, every remaining GPU on DP.

The table is one ``dse.engines.sweep.run_sweep`` over every plan of the space (full dump,
float64), so the procedures, the exhaustive best and the gap between them share one
set of numbers and one search engine. ``Space`` is the grid; ``table`` evaluates it; ``seed000`` and ``seed001``
walk it; ``best`` is the exhaustive optimum (least step time among feasible plans,
which at a fixed global batch is also the highest MFU).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from dse.equations import schedule
from dse.engines import sweep
from dse.evaluate import derived
from dse.inputs import RECOMPUTE, SELECTIVE_MODULES, Plan, recompute_name
from dse.report import REASONS

__all__ = ["Space", "Table", "Choice", "default_space", "table", "seed000", "seed001", "best"]

AXES = ("tp", "pp", "ep", "vpp", "mbs", "recompute", "recompute_every", "zero")


@dataclasses.dataclass(frozen=True)
class Space:
    """Candidate values per plan field (cp = 1, sequence parallelism on). ``recompute``: every mode
    of plan.RECOMPUTE but MaxText's qkv (none, selective, full, op); ``recompute_every``: full recompute of every
    layer (1) or of every other one (2, torchtitan's default selective_ac_option), the others
    keeping every tensor. It changes only full recompute: the other modes' rows with 2 repeat
    those with 1 (``recompute_options`` leaves them out)."""

    tp: tuple
    pp: tuple
    ep: tuple
    vpp: tuple = (1, 2, 4)
    mbs: tuple = (1, 2, 4, 8)
    recompute: tuple = (0, 1, 2, 3)
    recompute_every: tuple = (1, 2)
    zero: tuple = (0, 1, 2, 3)

    @property
    def size(self) -> int:
        """Grid points the sweep evaluates (the product of the axes)."""
        return int(np.prod([len(getattr(self, a)) for a in AXES]))

    @property
    def distinct(self) -> int:
        """Distinct plans of the grid (``recompute_options`` for the two recompute axes)."""
        rc = len(self.recompute) * len(self.recompute_every)
        return self.size // rc * len(self.recompute_options())

    def recompute_options(self) -> list:
        """The distinct (recompute, recompute_every) pairs: every > 1 only with full recompute."""
        return [(rc, n) for rc in self.recompute for n in self.recompute_every
                if n == self.recompute_every[0] or float(rc) == RECOMPUTE["full"]]


def _pow2_upto(n: float) -> tuple:
    out, x = [], 1
    while x <= n:
        out.append(x)
        x *= 2
    return tuple(out)


def default_space(model, cluster) -> Space:
    """Powers of two: t up to twice max(node, domain) (to show what crossing costs), p up to L, e dividing E."""
    f = lambda x: float(np.asarray(x))  # noqa: E731
    N, L, E = f(cluster.gpus), f(model.layers), f(model.experts)
    t_max = min(2 * max(f(cluster.gpus_per_node), f(cluster.domain)), N)
    ep = tuple(e for e in _pow2_upto(E) if E % e == 0) if E > 1 else (1,)
    return Space(tp=_pow2_upto(t_max), pp=_pow2_upto(min(L, N)), ep=ep)


@dataclasses.dataclass
class Table:
    """Every plan of a Space with the Report figures the procedures read (NumPy, flat)."""

    space: Space
    gbs: float
    cols: dict            # plan field -> array
    step_s: np.ndarray
    mfu: np.ndarray
    memory_bytes: np.ndarray
    feasible: np.ndarray  # bool
    reasons: np.ndarray
    microbatches: np.ndarray
    dp: np.ndarray
    bubble_fraction: np.ndarray
    index: dict           # (tp, pp, ep, vpp, mbs, recompute, recompute_every, zero) -> row
    best_row: int | None = None   # the sweep's best point (least step time among feasible plans)
    distinct: np.ndarray | None = None   # bool: not a repeat (recompute_every > 1 without full recompute)

    def row(self, **kw):
        kw.setdefault("recompute_every", 1)
        return self.index.get(tuple(float(kw[a]) for a in AXES))

    def plan(self, i) -> dict:
        return {a: float(self.cols[a][i]) for a in AXES}


def table(model, cluster, gbs, fidelity: str = "seed", space: Space | None = None) -> Table:
    """Evaluate the whole space with ``dse.engines.sweep.run_sweep`` (full dump, float64): one search engine.

    The sweep's flat index is row-major with the last axis fastest, the order of
    ``itertools.product`` over AXES, so row i of the dump is plan i of ``cols``. Its best
    point (least step time among feasible plans) is ``Table.best_row``.
    """
    space = space or default_space(model, cluster)
    grid = list(itertools.product(*(getattr(space, a) for a in AXES)))
    cols = {a: np.array([g[k] for g in grid], dtype=float) for k, a in enumerate(AXES)}
    base = {f.name: float(f.default) for f in dataclasses.fields(Plan) if f.default is not dataclasses.MISSING}
    base.update(tp=1.0, pp=1.0, mbs=1.0, gbs=float(gbs))
    axes = tuple(sweep.Axis(a, tuple(getattr(space, a)), tuple(float(v) for v in getattr(space, a))) for a in AXES)
    spec = sweep.SweepSpec(model=model, cluster=cluster, plan=base, axes=axes, objective="step_s", top_k=1,
                           dump=True, fidelity=fidelity, precision="float64", name="suggest")
    res = sweep.run_sweep(spec)
    dump = res.dump
    order = np.argsort(dump["index"])
    col = lambda name: np.asarray(dump[name])[order]  # noqa: E731
    reasons = col("reasons").astype(np.int64)
    plan = Plan.make(tp=cols["tp"], pp=cols["pp"], ep=cols["ep"], vpp=cols["vpp"], mbs=cols["mbs"], gbs=gbs)
    d, _, m = derived(cluster, plan)                       # evaluate's own d = N/(t c p), m = B/(d b)
    bubble = schedule.bubble_fraction(plan.pp, m, plan.vpp)
    a = lambda x: np.broadcast_to(np.asarray(x), (len(grid),))  # noqa: E731
    distinct = (cols["recompute_every"] == float(space.recompute_every[0])) | (cols["recompute"] == RECOMPUTE["full"])
    tab = Table(space, float(gbs), cols, col("step_s"), col("mfu"), col("memory_bytes"), reasons == 0, reasons,
                a(m), a(d), a(bubble), {tuple(float(x) for x in g): i for i, g in enumerate(grid)}, distinct=distinct)
    if res.best is not None:          # a repeat that ties its twin is named by the twin
        i = int(res.best["index"])
        tab.best_row = i if distinct[i] else tab.row(**dict(tab.plan(i), recompute_every=space.recompute_every[0]))
    return tab


@dataclasses.dataclass
class Choice:
    name: str
    row: int | None
    reasoning: list


def _gb(x) -> str:
    return f"{x / 1e9:.1f} GB"


def _why(tab: Table, i) -> str:
    if i is None:
        return "not in the space"
    bits = int(tab.reasons[i])
    names = [msg for k, (_, msg) in enumerate(REASONS) if bits & (1 << k)]
    return "; ".join(names) if names else "feasible"


def _smallest_p(tab: Table, **kw):
    """Smallest pp (ascending) whose plan is feasible, and the row of the one just below it."""
    prev = None
    for p in tab.space.pp:
        i = tab.row(pp=p, **kw)
        if i is not None and tab.feasible[i]:
            return p, i, prev
        prev = (p, i)
    return None, None, prev


def _ep_in_domain(tab: Table, t, model, cluster) -> int:
    """Seed 000 step 5: the largest e dividing E with t e <= domain (all-to-all inside the domain)."""
    U = float(np.asarray(cluster.domain))
    ok = [e for e in tab.space.ep if t * e <= U]
    return max(ok) if ok else 1


def seed001(tab: Table, model, cluster, mbs=1) -> Choice:
    """TP = GPUs per node, PP only as memory forces, m >= 4p, the rest DP (seed 001, the default)."""
    f = lambda x: float(np.asarray(x))  # noqa: E731
    g, heads, N = f(cluster.gpus_per_node), f(model.heads), f(cluster.gpus)
    why = []
    t = g
    while t > 1 and (heads % t or t not in tab.space.tp):
        t /= 2
    why.append(f"TP = {t:g}: the GPUs per node ({g:g})" + ("" if t == g else f", lowered to divide {heads:g} heads"))
    e = _ep_in_domain(tab, t, model, cluster) if f(model.experts) > 1 else 1
    if e > 1:
        why.append(f"EP = {e:g}: the experts spread over the rest of the domain (t e <= {f(cluster.domain):g})")
    base = dict(tp=t, ep=e, vpp=1, mbs=mbs, recompute=1, zero=1)
    p, i, prev = _smallest_p(tab, **base)
    if i is None:
        base["recompute"] = 2
        p, i, prev = _smallest_p(tab, **base)
        if i is None:
            why.append(f"no PP up to {max(tab.space.pp)} fits with selective or full recomputation")
            return Choice("seed 001 default", None, why)
        why.append("selective recomputation does not fit at any PP: full recomputation")
    below = (f" (PP {prev[0]:g}: {_why(tab, prev[1])}, {_gb(tab.memory_bytes[prev[1]])})"
             if prev and prev[1] is not None else "")
    why.append(f"PP = {p:g}: the smallest power of two that fits "
               f"{_gb(f(cluster.hbm_bytes))} ({_gb(tab.memory_bytes[i])} a GPU){below}")
    m = tab.microbatches[i]
    why.append(f"m = {m:g} {'>=' if m >= 4 * p else '<'} 4p = {4 * p:g}"
               + ("" if m >= 4 * p or p == 1 else ": too few microbatches, the bubble is a line item"))
    why.append(f"DP = {tab.dp[i]:g} takes the remaining GPUs ({N:g} / ({t:g} x {p:g}))")
    return Choice("seed 001 default", i, why)


def seed000(tab: Table, model, cluster) -> Choice:
    """Seed 000 sec.7's five steps, each a rule over the table."""
    f = lambda x: float(np.asarray(x))  # noqa: E731
    U, E = f(cluster.domain), f(model.experts)
    why = []
    t = e = None
    for tt in [x for x in tab.space.tp if x <= U]:
        ee = _ep_in_domain(tab, tt, model, cluster) if E > 1 else 1
        for z in (1, 2):
            p, i, _ = _smallest_p(tab, tp=tt, ep=ee, vpp=1, mbs=1, recompute=1, zero=z)
            if i is not None:
                t, e = tt, ee
                break
        if t is not None:
            break
    if t is None:
        why.append(f"1. no TP up to the domain ({U:g}) fits at any PP: nothing to suggest")
        return Choice("seed 000 procedure", None, why)
    why.append(f"1. TP = {t:g}: the smallest power of two up to the domain ({U:g}) at which the state fits")
    if E > 1:
        why.append(f"5. EP = {e:g}: experts spread as far as the domain allows (t e = {t * e:g} <= {U:g})")
    zero = 1
    p, i, prev = _smallest_p(tab, tp=t, ep=e, vpp=1, mbs=1, recompute=1, zero=1)
    if i is None:
        zero = 2
        p, i, prev = _smallest_p(tab, tp=t, ep=e, vpp=1, mbs=1, recompute=1, zero=2)
    below = (f"; PP {prev[0]:g}: {_why(tab, prev[1])}" if prev and prev[1] is not None else "")
    why.append(f"2. PP = {p:g}: the smallest that fits with ZeRO-{zero} ({_gb(tab.memory_bytes[i])} a GPU{below})")
    m = tab.microbatches[i]
    v = 1
    if p > 1 and m < 4 * p:
        tried = []
        for vv in tab.space.vpp:
            j = tab.row(tp=t, pp=p, ep=e, vpp=vv, mbs=1, recompute=1, zero=zero)
            if vv > 1 and j is not None and tab.feasible[j] and vv * m >= 4 * p:
                v, i = vv, j
                break
            if vv > 1:
                tried.append(f"v = {vv}: {_why(tab, j) if j is not None and not tab.feasible[j] else 'v m < 4p'}")
        why.append(f"3. d = {tab.dp[i]:g}, m = {m:g} < 4p = {4 * p:g}: "
                   + (f"interleave v = {v} (bubble {100 * tab.bubble_fraction[i]:.1f}%)" if v > 1
                      else f"no interleave fits ({'; '.join(tried)}); the bubble stays"))
    else:
        why.append(f"3. d = {tab.dp[i]:g}, m = {m:g} >= 4p = {4 * p:g}")
    # 4. tune b and recomputation (and the ZeRO stage that fits) at these degrees: least step time
    rows = [tab.row(tp=t, pp=p, ep=e, vpp=v, mbs=b, recompute=rc, recompute_every=n, zero=z)
            for b in tab.space.mbs for rc, n in tab.space.recompute_options() for z in (1, 2) if z in tab.space.zero]
    rows = [j for j in rows if j is not None and tab.feasible[j]]
    j = min(rows, key=lambda k: tab.step_s[k]) if rows else i
    pl = tab.plan(j)
    why.append(f"4. b = {pl['mbs']:g}, recompute {recompute_name(pl['recompute'], pl['recompute_every'], pl.get('recompute_modules', SELECTIVE_MODULES))}, ZeRO-{pl['zero']:g}: the fastest "
               f"of {len(rows)} fitting (b, recompute, ZeRO) choices at these degrees "
               f"({tab.step_s[i]:.3f} s -> {tab.step_s[j]:.3f} s)")
    return Choice("seed 000 procedure", j, why)


def best(tab: Table):
    """Row of the least step time among feasible plans (the sweep's best), and how many distinct
    plans are feasible."""
    return tab.best_row, int(np.count_nonzero(tab.feasible & tab.distinct))
