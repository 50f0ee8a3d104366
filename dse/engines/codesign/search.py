"""One co-design case: relaxed optimization, snapping, polish, exact re-evaluation, and the checks
(exhaustive search where the space is small enough; the non-gradient baseline when asked)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from dse.backend import x64
from dse.engines.codesign import baseline as base_search
from dse.engines.codesign import discrete, relax
from dse.engines.codesign.compiled import anneal_steps, compiled
from dse.engines.codesign.problem import budget_usd
from dse.engines.codesign.spec import CLUSTER_VARS, Spec
from dse.inputs import Cluster, ModelShape, Plan

__all__ = ["Found", "Case", "Result", "optimize", "run_case", "run", "space_size", "found",
           "CONVERGED_LOG2", "CONVERGED_WEIGHT", "CONVERGED_LOSS"]

CONVERGED_LOG2 = 0.05    # a start converged when its log2 variables moved less than this (3.5%) in the last quarter
CONVERGED_WEIGHT = 0.95  # ... and each categorical's largest weight ends above this (nearly one-hot)
CONVERGED_LOSS = 1e-3    # ... or its relaxed loss (a log) changed less than this (0.1%) over the last quarter


@dataclasses.dataclass
class Found:
    """One discrete point: free values, categoricals, the exact objective and the full Report."""

    values: dict
    categorical: dict
    objective: float
    cost_usd: float
    report: Any
    model: ModelShape
    cluster: Cluster
    plan: Plan


@dataclasses.dataclass
class Case:
    model: str
    cluster: str
    objective: str
    gradient: Found | None
    relaxed_loss: float
    converged: bool
    starts_converged: int
    evaluations: int          # relaxed evaluations (starts x steps x blended options) + exact ones (snap + polish)
    seconds: float
    exhaustive: Found | None = None
    exhaustive_evaluations: int = 0
    exhaustive_seconds: float = 0.0
    space_size: int = 0
    budget_usd: float = 0.0   # the total cost cap of this case (0: none)
    history: dict | None = None   # "loss" and each free variable, relaxed, [steps, starts] (plots)
    why_not_converged: str = ""   # when not converged: what moved, and the setting to change
    best_start: int = -1          # the start whose snapped, polished point is reported
    baseline: Found | None = None
    baseline_evaluations: int = 0
    baseline_seconds: float = 0.0

    @property
    def gap(self):
        if self.exhaustive is None or self.gradient is None:
            return None
        return self.gradient.objective / self.exhaustive.objective - 1.0

    @property
    def baseline_gap(self):
        if self.baseline is None or self.gradient is None:
            return None
        return self.gradient.objective / self.baseline.objective - 1.0


@dataclasses.dataclass
class Result:
    spec: Spec
    cases: list


def space_size(spec: Spec) -> int:
    _, combos, _ = relax.cat_grid(spec)
    return int(np.prod([len(v.values) for v in spec.free])) * len(combos)


def optimize(spec: Spec, model: ModelShape, cluster: Cluster):
    """Projected Adam from ``spec.starts`` uniform starts in the log2 box, all starts in one compiled
    scan (one broadcast evaluate of every start and option a step), sharpness annealed geometrically
    and the categorical temperature with it.

    Returns a dict: u, theta, cats (each start's argmax codes), loss[steps, starts],
    moved[starts] (largest change of a log2 variable over the last quarter), xs[steps, starts,
    vars] (free variables, spec units, before each step), weights[steps, starts, options],
    onehot[starts] (smallest largest-weight over the categoricals at the end), over[steps, starts]
    (log relaxed cost / cap before each step; -inf where the budget is not projected)."""
    fn = compiled(spec)
    names, combos, index = fn.names, fn.combos, fn.index
    S, T = spec.starts, spec.steps
    rr = np.asarray(combos[np.arange(S) % len(combos)])
    k0, k1 = spec.sharpness
    # the sharpness rises geometrically over the first ANNEAL_SHARE (compiled.py) of the steps and then holds, so
    # the last quarter (where convergence is judged) optimizes one fixed problem
    T_anneal = anneal_steps(T)
    # in numpy: no eager op to compile (its pow and XLA:CPU's may differ in the last bit)
    ks = k0 * (k1 / k0) ** np.minimum(np.arange(T) / max(T_anneal - 1, 1), 1.0)
    taus = k0 / ks                       # 1 -> k0/k1: weights tend to one-hot as the steps tend to hard
    params, hist, us, ws, over, w_end = fn.run_all(model, cluster, np.asarray(float(spec.budget_usd)),
                                                   np.asarray(float(spec.lr)), np.asarray(spec.seed), rr, ks, taus)
    u, theta = np.asarray(params["u"]), np.asarray(params["theta"])
    zs = discrete.log2_values(spec, us)                      # [T, S, n] log2 values before each step
    z_end = discrete.log2_values(spec, u)
    tail = _tail(T)
    moved = np.max(np.abs(z_end - zs[T - tail]), axis=-1) if len(spec.free) else np.zeros(S)
    relaxed = spec.categorical_mode == "relax" and names
    if relaxed:
        w_end = np.split(np.asarray(w_end), np.cumsum([len(v) for v in spec.categorical.values()])[:-1], axis=-1)
        cats = np.stack([np.asarray(spec.categorical[n])[np.argmax(w, -1)] for n, w in zip(names, w_end)], -1)
        onehot = np.min(np.stack([np.max(w, -1) for w in w_end], -1), -1)
    else:
        cats, onehot = np.asarray(rr), np.ones(S)
    return dict(u=u, theta=theta, cats=cats, loss=np.asarray(hist), moved=moved, xs=np.exp2(zs),
                weights=np.asarray(ws), onehot=onehot, relaxed=bool(relaxed), over=np.asarray(over))


def found(spec: Spec, model, cluster, idx, cat) -> Found | None:
    """The exact evaluation of one allowed point (compiled once per spec); None if infeasible."""
    if idx is None:
        return None
    cat = np.asarray(cat, dtype=float).reshape(len(spec.categorical))
    m, c, p, r, val, cost, ok = discrete.Counter(spec, model, cluster).detail(np.asarray(idx, dtype=int), cat)
    x = {v.name: v.values[int(idx[i])] for i, v in enumerate(spec.free)}
    if not bool(ok):
        return None   # never report an infeasible point
    return Found(values={k: float(v) for k, v in x.items()},
                 categorical={n: float(cat[i]) for i, n in enumerate(spec.categorical)},
                 objective=float(val), cost_usd=float(cost), report=r, model=m, cluster=c, plan=p)


def _tail(steps):
    """The window convergence is judged on: the last quarter of the steps, at least 10 (all if fewer)."""
    return min(steps, max(10, steps // 4))


def _why(spec, opt, j):
    """Why start j did not converge, and what to change."""
    out = []
    if opt["moved"][j] >= CONVERGED_LOG2:
        i = int(np.argmax(np.abs(np.log2(opt["xs"][-1, j]) - np.log2(opt["xs"][-_tail(spec.steps), j]))))
        tail = _tail(spec.steps)
        dl = abs(opt["loss"][-1, j] - opt["loss"][spec.steps - tail, j])
        out.append(f"{spec.free[i].name} still moved {opt['moved'][j]:.2f} log2 units over the last quarter "
                   f"of the steps, left its allowed-value cell, and the relaxed loss still changed "
                   f"{100 * dl:.2f}% (raise search.steps, or lower search.lr)")
    if opt["onehot"][j] < CONVERGED_WEIGHT:
        out.append(f"a categorical weight ended at {opt['onehot'][j]:.2f} < {CONVERGED_WEIGHT} "
                   "(raise search.steps or the final search.sharpness)")
    return "; ".join(out)


def run_case(spec: Spec, label_model, model, label_cluster, cluster, *, exhaustive_search=True) -> Case:
    """One (model, cluster, budget) case: the gradient path, and the exhaustive search and the
    baseline where asked. Always in float64 (``x64``), as ``dse codesign`` runs: with the caller's
    x64 off the optimizer's program would trace in float32, a different program with another answer
    (``shape`` gave its optimum without x64 and a design 2.858% worse with it, at polish 12)."""
    with x64(True):
        return _run_case(spec, label_model, model, label_cluster, cluster, exhaustive_search=exhaustive_search)


def _run_case(spec: Spec, label_model, model, label_cluster, cluster, *, exhaustive_search=True) -> Case:
    t0 = time.perf_counter()
    opt = optimize(spec, model, cluster)
    # the relaxed trajectory for dse.plot.codesign_figures: loss and each free variable (spec units)
    history = {"loss": opt["loss"], **{v.name: opt["xs"][:, :, i] for i, v in enumerate(spec.free)}}
    ev = discrete.Counter(spec, model, cluster)
    idx, cat, vals, start_of = discrete.snap(spec, opt["u"], opt["cats"], ev)
    # a start converged when its categorical weights are one-hot and either its log2 variables moved
    # less than CONVERGED_LOG2 over the last quarter of the steps or the allowed-value cell around it
    # (what snapping sees) did not change over that quarter
    # (or, along a flat direction, its relaxed loss changed by less than CONVERGED_LOSS over that quarter)
    tail = _tail(spec.steps)
    flat = np.abs(opt["loss"][-1] - opt["loss"][spec.steps - tail]) < CONVERGED_LOSS
    conv = ((opt["moved"] < CONVERGED_LOG2) | _same_cell(spec, opt) | flat | _stalled_on_budget(spec, opt)) \
        & (opt["onehot"] >= CONVERGED_WEIGHT)
    # polish the best snapped point of each of the best ``spec.polish`` distinct layouts (plan,
    # model and categorical values; hardware free), so one layout cannot crowd out the others
    layout = [i for i, v in enumerate(spec.free) if v.name not in CLUSTER_VARS]
    best_of = {}
    for j in np.argsort(vals):
        if not np.isfinite(vals[j]):
            break
        best_of.setdefault(tuple(idx[j, layout]) + tuple(cat[j]), j)
    best = (None, None, np.inf, -1)
    chosen = list(best_of.values())[: max(spec.polish, 1)]
    points = [(idx[j], cat[j], float(vals[j])) for j in chosen]
    if spec.polish:   # every layout's polish in lock-step: one exact call a round (discrete.polish_many)
        points = [p[:3] for p in discrete.polish_many(spec, points, ev)]
    for j, (pi, pc, pv) in zip(chosen, points):
        if pv < best[2]:
            best = (pi, pc, pv, int(start_of[j]))
    history = _with_discrete_end(spec, history, idx, cat, vals, start_of, best)
    n_relaxed = spec.starts * spec.steps * (len(compiled(spec).combos) if opt["relaxed"] else 1)
    f = found(spec, model, cluster, best[0], best[1])
    bs = best[3] if best[3] >= 0 else int(np.argmin(opt["loss"][-1]))
    case = Case(model=label_model, cluster=label_cluster, objective=spec.objective, gradient=f,
                relaxed_loss=float(opt["loss"][-1, bs]), converged=bool(conv[bs]),
                starts_converged=int(conv.sum()), evaluations=n_relaxed + ev.n, history=history,
                seconds=time.perf_counter() - t0, space_size=space_size(spec), best_start=bs,
                why_not_converged="" if conv[bs] else _why(spec, opt, bs))
    if exhaustive_search and 0 < case.space_size <= spec.exhaustive_max:
        t1 = time.perf_counter()
        ei, ec, _, n = discrete.exhaustive(spec, model, cluster)
        case.exhaustive = found(spec, model, cluster, ei, ec)
        case.exhaustive_evaluations = n
        case.exhaustive_seconds = time.perf_counter() - t1
    if spec.baseline:
        t1 = time.perf_counter()
        bi, bc, _, n = base_search.random_local_search(spec, model, cluster, 10 * case.evaluations)
        case.baseline = found(spec, model, cluster, bi, bc)
        case.baseline_evaluations = n
        case.baseline_seconds = time.perf_counter() - t1
    return case


def _with_discrete_end(spec, history, idx, vals_idx_cat=None, vals=None, start_of=None, best=None):
    """The trajectory ends at the designs: one more row (iteration ``steps``) holds each start's best
    snapped point (its exact log objective as the loss), and the reported, polished design for the
    start it came from, so the plotted best start (lowest final loss) ends at the reported design."""
    S = spec.starts
    end = {k: np.full(S, np.nan) for k in history}
    for j in np.argsort(vals)[::-1]:            # best last, so it wins its start's row
        s = start_of[j]
        if s >= 0 and np.isfinite(vals[j]):
            end["loss"][s] = np.log(vals[j])
            for i, v in enumerate(spec.free):
                end[v.name][s] = v.values[int(idx[j, i])]
    if best[0] is not None and best[3] >= 0:
        end["loss"][best[3]] = np.log(best[2])
        for i, v in enumerate(spec.free):
            end[v.name][best[3]] = v.values[int(best[0][i])]
    out = {k: np.concatenate([np.asarray(h), end[k][None, :]], 0) for k, h in history.items()}
    out["iteration"] = np.arange(spec.steps + 1, dtype=float)
    return out


def _stalled_on_budget(spec, opt):
    """Starts held on the budget line that stopped improving: the budget active through the last quarter
    and the relaxed loss's best over its second half no better (by CONVERGED_LOSS) than over its first.
    The relaxed cost is a staircase smoothed between whole links and NICs (dse/equations/cost.py
    RELAXED_SHARPNESS), so a budget-bound optimum sits at a step's corner, where the projected step
    climbs the riser and the restoring step pulls it back: the iterate cycles about the corner
    (0.05-0.1 log2 units) with no progress, a constrained optimum at the relaxation's resolution, not
    a start still descending."""
    tail = _tail(spec.steps)
    T = spec.steps
    if not np.isfinite(opt["over"]).any():
        return np.zeros(spec.starts, bool)
    window = opt["over"][T - tail:]
    on_line = np.all(window > -_BUDGET_NEAR, axis=0)
    half = T - tail // 2
    first, second = np.min(opt["loss"][T - tail:half], axis=0), np.min(opt["loss"][half:], axis=0)
    return on_line & (second > first - CONVERGED_LOSS)


_BUDGET_NEAR = 0.05   # log cost within 5% of the cap (about one whole-link step of the cost): on its budget line


def _same_cell(spec, opt):
    """Whether each start's allowed-value cell is the same at the start of the last quarter and at the end."""
    tail = _tail(spec.steps)
    u_then = discrete.box_points(spec, np.log2(opt["xs"][spec.steps - tail]))
    a, b = discrete.neighbors(spec, opt["u"]), discrete.neighbors(spec, u_then)
    return np.all(a[0] == b[0], axis=1) & np.all(a[1] == b[1], axis=1)


def run(spec: Spec, *, exhaustive_search=True) -> Result:
    """Every (model, cluster, budget) case of the spec; a list of budgets traces the Pareto
    front of the objective against hardware cost (the epsilon-constraint method)."""
    cases = []
    for lm, m in spec.models:
        for lc, c in spec.clusters:
            for b in spec.budgets:
                sb = dataclasses.replace(spec, budget_usd=b)
                case = run_case(sb, lm, m, lc, c, exhaustive_search=exhaustive_search)
                case.budget_usd = float(budget_usd(sb, c))
                cases.append(case)
    return Result(spec=spec, cases=cases)

