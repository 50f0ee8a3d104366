"""Co-design by gradient: hardware, plan and model shape optimized through ``evaluate``.

The same ``evaluate`` with a finite ``sharpness`` (dse/equations/steps.py) is smooth in every
degree, bandwidth and size; degrees and sizes are continuous log2 variables
(x = 2**z), categorical choices (ZeRO stage, recompute) are enumerated across the
starts. optax's Adam runs from many starts, vmapped in one ``jit``, while the
sharpness anneals from soft to nearly hard; each start is then snapped to the allowed
discrete values (the corners of the grid cell around it), re-evaluated exactly
(``sharpness=None``), and the best feasible points are polished by a discrete local
search. Where the space is small enough the exhaustive search over the same allowed
values runs too, and the result reports the gap and the evaluations each used.

Library only: nothing here prints. ``dse codesign FILE`` formats a ``Result``.
Spec format: see ``sweeps/codesign_*.toml`` and README "Co-design".
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dse.inputs import checks
from dse.equations import goodput as gp
from dse.equations import feasibility, memory, steps, topology
from dse.inputs import presets
from dse.errors import InputError
from dse.evaluate import evaluate
from dse.inputs.fidelity import default_mode, resolve
from dse.inputs import RECOMPUTE, Cluster, ModelShape, Plan
from dse.report import Report

__all__ = ["Spec", "Var", "Case", "Result", "load_spec", "parse_spec", "run", "run_case",
           "OBJECTIVES", "PLAN_VARS", "CLUSTER_VARS", "MODEL_VARS", "CATEGORICAL_VARS"]

OBJECTIVES = ("step_time", "time_to_train", "step_time_cost")
PLAN_VARS = ("tp", "pp", "cp", "ep", "mbs", "vpp")
# spec name -> (Cluster field, factor to SI), the presets' units (GB/s, GB, TFLOP/s, us).
CLUSTER_VARS = {k: v for k, v in presets.CLUSTER_UNITS.items()
                if k in ("gpus", "tflops", "hbm_GB", "domain", "bw_up_GBps", "bw_out_GBps",
                         "alpha_up_us", "alpha_out_us", "torus_bw_x_GBps", "torus_bw_y_GBps",
                         "torus_bw_z_GBps")}
# hidden: layers follow to hold the parameter count (and heads, FFN widths scale with h).
MODEL_VARS = ("hidden", "layers", "experts", "topk")
# torus_order: which physical axis each rank stride fills first ("xyz", "zyx", ...; dse/equations/topology.py),
# so a torus mapping is one categorical choice among the 6 permutations, enumerated like ZeRO.
CATEGORICAL_VARS = {"zero": {"0": 0.0, "1": 1.0, "2": 2.0, "3": 3.0}, "recompute": RECOMPUTE,
                    "torus_order": {"".join(topology.AXES[i] for i in perm): float(code)
                                    for code, perm in enumerate(topology.TORUS_ORDERS)},
                    "dp_hierarchical": {"0": 0.0, "1": 1.0}}
# Integer-valued variables default to powers of two; the others to log-spaced levels.
_POW2_DEFAULT = set(PLAN_VARS) | {"gpus", "domain", "experts", "topk"}
CONVERGED_LOG2 = 0.05   # a start converged when its log2 variables moved less than this (3.5%) in the last quarter
PENALTY_WEIGHT = 10.0
HW_TRADE = 4            # polish: one hardware variable moves 1 level while another moves up to 4   # per unit of log-violation (squared and linear) in the relaxed loss


# ---------------------------------------------------------------- spec


@dataclasses.dataclass(frozen=True)
class Var:
    """One free numeric variable: its allowed values (spec units), optimized as log2."""

    name: str
    values: tuple[float, ...]       # sorted allowed values, spec units

    @property
    def lo(self):
        return math.log2(self.values[0])

    @property
    def hi(self):
        return math.log2(self.values[-1])


@dataclasses.dataclass(frozen=True)
class Spec:
    models: tuple[tuple[str, ModelShape], ...]   # (label, model)
    clusters: tuple[tuple[str, Cluster], ...]    # (label, cluster)
    plan: dict                                   # fixed plan fields (gbs, mbs, ...)
    objective: str
    tokens: float                                # time_to_train
    cost_weight: float                           # step_time_cost: minimize step * cost^w
    budget_usd: float                            # hardware cost cap, total or per accelerator (0: none)
    budget_per_gpu: bool                         # budget_usd is per accelerator
    budgets: tuple                               # a list of budgets: one case each (a Pareto front)
    prices: dict                                 # var or "gpus" -> USD per unit per accelerator
    network_cost: bool                           # use Report.network_cost_usd when present
    failure_rate_per_gpu_s: float
    checkpoint_write_s: float
    restart_s: float
    free: tuple[Var, ...]
    categorical: dict                            # name -> tuple of codes
    fidelity: Any
    starts: int
    steps: int
    lr: float
    sharpness: tuple[float, float]
    seed: int
    exhaustive_max: int
    polish: int
    hold_params: bool

    @property
    def names(self):
        return tuple(v.name for v in self.free)


def _table(raw, key):
    val = raw.get(key, {})
    if not isinstance(val, dict):
        raise InputError(f"{key}: must be a table")
    return val


def _number(where, value, minimum=None):
    x = checks.number(where, value, minimum=-checks.MAX_MAGNITUDE)   # type and magnitude (dse/inputs/checks.py)
    if not math.isfinite(x) or (minimum is not None and x < minimum):
        raise InputError(f"{where}: {value!r} is not allowed; allowed: a finite number >= {minimum:g}")
    return x


MAX_ALLOWED_VALUES = 4096   # values one free variable may take (bounds the exhaustive search's memory)


def _allowed_values(name: str, raw) -> tuple[float, ...]:
    """Allowed values of a free variable: values=[...], or min/max with pow2|levels|multiple."""
    where = f"free.{name}"
    if isinstance(raw, list):
        raw = {"values": raw}
    if not isinstance(raw, dict):
        raise InputError(f"{where}: give a table {{min, max}} or {{values = [...]}}")
    unknown = set(raw) - {"min", "max", "values", "levels", "multiple"}
    if unknown:
        raise InputError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: min, max, values, levels, multiple")
    if "values" in raw:
        vals = sorted({_number(where, v) for v in raw["values"]})
        if not vals or vals[0] <= 0:
            raise InputError(f"{where}: values must be positive numbers")
        return tuple(vals)
    if "min" not in raw or "max" not in raw:
        raise InputError(f"{where}: give min and max (or values)")
    lo, hi = _number(f"{where}.min", raw["min"]), _number(f"{where}.max", raw["max"])
    if lo <= 0:
        raise InputError(f"{where}.min: {lo:g} is not allowed; allowed: a positive number")
    if lo > hi:
        raise InputError(f"{where}: bounds reversed (min {lo:g} > max {hi:g}); allowed: min <= max")
    if "multiple" in raw:
        k = _number(f"{where}.multiple", raw["multiple"], 1e-12)
        if (hi - lo) / k > MAX_ALLOWED_VALUES:
            raise InputError(f"{where}.multiple: {k:g} gives more than {MAX_ALLOWED_VALUES} values between {lo:g} and "
                             f"{hi:g}; allowed: a larger multiple")
        vals = [k * i for i in range(math.ceil(lo / k - 1e-9), math.floor(hi / k + 1e-9) + 1)]
    elif "levels" in raw or name not in _POW2_DEFAULT:
        n = int(_number(f"{where}.levels", raw.get("levels", 16), 1))
        if n > MAX_ALLOWED_VALUES:
            raise InputError(f"{where}.levels: {n} is not allowed; allowed: 1..{MAX_ALLOWED_VALUES}")
        vals = [lo] if n == 1 or lo == hi else list(np.geomspace(lo, hi, n))
    else:
        for key, bound in (("min", lo), ("max", hi)):   # a degree is a power of two: never narrowed silently
            if 2.0 ** round(math.log2(bound)) != bound:
                raise InputError(f"{where}.{key}: {bound:g} is not a power of two; allowed: powers of two "
                                 f"(or values = [...], multiple = k)")
        vals = [2.0 ** i for i in range(math.ceil(math.log2(lo) - 1e-9), math.floor(math.log2(hi) + 1e-9) + 1)]
    if not vals:
        raise InputError(f"{where}: no allowed value between {lo:g} and {hi:g}")
    return tuple(float(v) for v in vals)


def _categorical(name: str, raw) -> tuple[float, ...]:
    table = CATEGORICAL_VARS[name]
    items = list(table) if raw == "all" else raw if isinstance(raw, list) else [raw]
    out = []
    for it in items:
        key = str(int(it)) if isinstance(it, (int, float)) and not isinstance(it, bool) else str(it)
        if key not in table:
            raise InputError(f"free.{name}: unknown {it!r}; allowed: {', '.join(table)}")
        out.append(table[key])
    if not out:
        raise InputError(f"free.{name}: give at least one value")
    return tuple(sorted(set(out)))


def _as_list(x):
    return x if isinstance(x, list) else [x]


def parse_spec(raw: dict) -> Spec:
    """Validate a co-design spec (a dict read from TOML). Bad input raises InputError."""
    known = {"model", "cluster", "plan", "objective", "free", "cost", "goodput", "search"}
    unknown = set(raw) - known
    if unknown:
        raise InputError(f"codesign: unknown table(s) {sorted(unknown)}; allowed: {', '.join(sorted(known))}")

    # models: preset name(s) or inline fields
    mt = _table(raw, "model")
    overrides = {k: v for k, v in mt.items() if k not in ("preset", "presets")}
    names = _as_list(mt.get("presets", mt.get("preset", [])))
    if names:
        models = tuple((n, presets.load_model(n, **overrides)) for n in names)
    else:
        models = (("model", presets.model_from_fields(overrides)),)

    # clusters: a preset with overrides; gpus may be a list (one case each)
    ct = dict(_table(raw, "cluster"))
    base = ct.pop("preset", "seed")
    gpu_list = _as_list(ct.pop("gpus", None))
    clusters = []
    for g in gpu_list:
        c = presets.load_cluster(base, **({"gpus": g} if g is not None else {}), **ct)
        clusters.append((f"{base} N={float(c.gpus):g}", c))

    plan = dict(_table(raw, "plan"))
    bad = set(plan) - set(Plan.__dataclass_fields__)
    if bad:
        raise InputError(f"plan: unknown field(s) {sorted(bad)}; allowed: {', '.join(Plan.__dataclass_fields__)}")
    if "recompute" in plan:
        plan["recompute"] = _categorical("recompute", plan["recompute"])[0]
    plan = {k: _number(f"plan.{k}", v, 0) for k, v in plan.items()}
    if "gbs" not in plan:
        raise InputError("plan.gbs: required (the global batch in sequences is fixed by optimization)")

    ot = _table(raw, "objective")
    kind = ot.get("kind", "step_time")
    if kind not in OBJECTIVES:
        raise InputError(f"objective.kind: unknown {kind!r}; allowed: {', '.join(OBJECTIVES)}")
    tokens = _number("objective.tokens", ot.get("tokens", 0.0), 0)
    if kind == "time_to_train" and tokens <= 0:
        raise InputError("objective.tokens: required for time_to_train; allowed: a positive number")
    cost_weight = _number("objective.cost_weight", ot.get("cost_weight", 1.0), 0)
    bad = set(ot) - {"kind", "tokens", "cost_weight", "budget_usd", "budget_usd_per_gpu"}
    if bad:
        raise InputError(f"objective: unknown key(s) {sorted(bad)}; allowed: kind, tokens, cost_weight, "
                         "budget_usd, budget_usd_per_gpu")
    if "budget_usd" in ot and "budget_usd_per_gpu" in ot:
        raise InputError("objective: give budget_usd or budget_usd_per_gpu, not both")
    budget_per_gpu = "budget_usd_per_gpu" in ot
    budgets = tuple(_number("objective.budget_usd", b, 0)
                    for b in _as_list(ot.get("budget_usd_per_gpu", ot.get("budget_usd", 0.0))))
    if not budgets:
        raise InputError("objective.budget_usd: give a number or a non-empty list")
    budget = budgets[0]

    cost_t = dict(_table(raw, "cost"))
    network_cost = bool(cost_t.pop("network", False))
    prices = {}
    for k, v in cost_t.items():
        if not k.startswith("usd_per_"):
            raise InputError(f"cost.{k}: unknown; allowed: network, usd_per_<var> (usd_per_gpu, usd_per_bw_up_GBps, ...)")
        var = k[len("usd_per_"):]
        if var not in CLUSTER_VARS:
            raise InputError(f"cost.{k}: {var!r} is not a cluster field; allowed: {', '.join(CLUSTER_VARS)}")
        prices[var] = _number(f"cost.{k}", v, 0)
    if network_cost and "network_cost_usd" not in Report.__dataclass_fields__:
        raise InputError("cost.network: this build has no network cost model (Report.network_cost_usd); "
                         "allowed: usd_per_<field> prices")
    if (kind == "step_time_cost" or budget > 0) and not prices and not network_cost:
        raise InputError("cost: step_time_cost and budget_usd need prices (usd_per_<field>) or network = true")

    gt = _table(raw, "goodput")
    rate = _number("goodput.failure_rate_per_gpu_hour", gt.get("failure_rate_per_gpu_hour",
                                                               gp.LLAMA3_FAILURE_RATE_PER_GPU_S * 3600), 0) / 3600.0
    write = _number("goodput.checkpoint_write_s", gt.get("checkpoint_write_s", gp.CHECKPOINT_WRITE_S), 0)
    restart = _number("goodput.restart_s", gt.get("restart_s", gp.RESTART_S), 0)

    ft = _table(raw, "free")
    if not ft:
        raise InputError("free: give at least one free variable")
    allowed = list(PLAN_VARS) + list(CLUSTER_VARS) + list(MODEL_VARS) + list(CATEGORICAL_VARS)
    free, cats = [], {}
    for name, val in ft.items():
        if name not in allowed:
            raise InputError(f"free.{name}: unknown variable; allowed: {', '.join(allowed)}")
        if name in CATEGORICAL_VARS:
            cats[name] = _categorical(name, val)
        else:
            free.append(Var(name, _allowed_values(name, val)))
    for v in free:
        if v.name in ("experts", "topk", "ep"):
            for label, m in models:
                if float(m.experts) <= 1 and (v.name != "ep" or v.values[-1] > 1):
                    raise InputError(f"free.{v.name}: model {label!r} is dense (experts = 1) and has no {v.name}; "
                                     "allowed: a mixture-of-experts model")
        if v.name.startswith("torus_bw"):
            for label, c in clusters:
                if float(c.topology) != 2.0:
                    raise InputError(f"free.{v.name}: cluster {label!r} is not a torus; allowed: a torus cluster "
                                     "(topology = \"torus\")")
        if v.name in plan:
            raise InputError(f"free.{v.name}: also fixed in [plan]; give it in one place")
    if "hidden" in ft and "layers" in ft:
        raise InputError("free.hidden and free.layers: give one (layers follow hidden at a fixed parameter count)")

    st = _table(raw, "search")
    fid = st.get("fidelity") or default_mode(base if isinstance(base, str) else None)
    try:
        fidelity = resolve(fid)
    except InputError:
        raise InputError(f"search.fidelity: unknown {fid!r}; allowed: seed, calibrated") from None
    sharp = st.get("sharpness", [4.0, 200.0])
    sharp = tuple(_number("search.sharpness", s, 1e-6) for s in _as_list(sharp))
    if len(sharp) == 1:
        sharp = (sharp[0], sharp[0])
    return Spec(
        models=models, clusters=tuple(clusters), plan=plan, objective=kind, tokens=tokens,
        cost_weight=cost_weight, budget_usd=budget, budget_per_gpu=budget_per_gpu, budgets=budgets, prices=prices, network_cost=network_cost,
        failure_rate_per_gpu_s=rate, checkpoint_write_s=write, restart_s=restart,
        free=tuple(free), categorical=cats, fidelity=fidelity,
        starts=int(_number("search.starts", st.get("starts", 32), 1)),
        steps=int(_number("search.steps", st.get("steps", 200), 1)),
        lr=_number("search.lr", st.get("lr", 0.03), 1e-9),
        sharpness=sharp[:2],
        seed=int(_number("search.seed", st.get("seed", 0), 0)),
        exhaustive_max=int(_number("search.exhaustive_max", st.get("exhaustive_max", 5_000_000), 0)),
        polish=int(_number("search.polish", st.get("polish", 6), 0)),
        hold_params=bool(st.get("hold_params", True)),
    )


def load_spec(path) -> Spec:
    return parse_spec(presets.read_toml(path, "codesign"))


# ---------------------------------------------------------------- building inputs


def _shape_model(model: ModelShape, fid, hidden, hold_params: bool, exact: bool) -> ModelShape:
    """A model of width ``hidden``: heads, KV heads and FFN widths scale with h (head size
    fixed); with ``hold_params`` the layer count follows so the parameter count stays the
    base model's. Total parameters are affine in L (dse/equations/memory.py param_counts), so
    L = (P - P(L=0)) / (P(L=1) - P(L=0)) uses the one parameter equation."""
    r = hidden / model.hidden
    m = model.replace(hidden=hidden, heads=model.heads * r, kv_heads=model.kv_heads * r,
                      ffn_hidden=model.ffn_hidden * r, expert_ffn_hidden=model.expert_ffn_hidden * r)
    if not hold_params:
        return m
    target = memory.param_counts(model, fid)[0]
    p0 = memory.param_counts(m.replace(layers=0.0), fid)[0]
    p1 = memory.param_counts(m.replace(layers=1.0), fid)[0]
    layers = (target - p0) / (p1 - p0)
    return m.replace(layers=jnp.round(layers) if exact else layers)


def build(spec: Spec, model: ModelShape, cluster: Cluster, x: dict, cats: dict, exact: bool):
    """(model, cluster, plan) with free variables ``x`` (spec units) and categoricals ``cats``."""
    cl = {}
    for name, val in x.items():
        if name in CLUSTER_VARS:
            field, factor = CLUSTER_VARS[name]
            cl[field] = val * factor
    cluster = cluster.replace(**cl) if cl else cluster
    if "hidden" in x:
        model = _shape_model(model, spec.fidelity, x["hidden"], spec.hold_params, exact)
    mf = {k: x[k] for k in ("layers", "experts", "topk") if k in x}
    model = model.replace(**mf) if mf else model
    pf = dict(spec.plan)
    pf.update({k: x[k] for k in PLAN_VARS if k in x})
    pf.update(cats)
    pf.setdefault("mbs", 1.0)
    pf.setdefault("tp", 1.0)
    pf.setdefault("pp", 1.0)
    return model, cluster, Plan.make(**pf)


def hardware_cost_usd(spec: Spec, cluster: Cluster, report):
    """Total hardware cost: the spec's linear prices (USD per unit of each cluster field per
    accelerator) times N, plus the network model's parts (dse/equations/cost.py) with ``network = true``."""
    per_gpu = jnp.zeros_like(cluster.gpus)
    for var, price in spec.prices.items():
        field, factor = CLUSTER_VARS[var]
        per_gpu = per_gpu + price * (getattr(cluster, field) / factor if var != "gpus" else 1.0)
    total = per_gpu * cluster.gpus
    if spec.network_cost:
        total = total + report.network_cost_usd   # dse/equations/cost.py: switches, NICs, optics, links
    return total


def budget_usd(spec: Spec, cluster: Cluster):
    """The cost cap of this cluster (per-accelerator budgets scale with N)."""
    return spec.budget_usd * (cluster.gpus if spec.budget_per_gpu else 1.0)


def objective(spec: Spec, model, cluster, plan, report, sharpness=None):
    """(value, cost): the quantity minimized, in its own units, and the hardware cost."""
    cost = hardware_cost_usd(spec, cluster, report) if (spec.prices or spec.network_cost) else jnp.zeros_like(report.step_s)
    if spec.objective == "step_time":
        return report.step_s, cost
    if spec.objective == "time_to_train":
        g = gp.goodput(cluster.gpus, spec.failure_rate_per_gpu_s, spec.checkpoint_write_s, spec.restart_s,
                       sharpness=sharpness)
        return gp.time_to_train_s(spec.tokens, report.tokens_per_s, g), cost
    # step_time_cost: step * cost^w, scale-free; w sweeps the Pareto front
    return report.step_s * cost ** spec.cost_weight, cost


def _violations(spec, model, cluster, plan, report, cost):
    """Signed margins (> 0 is infeasible) of the feasibility table's rules, plus the budget."""
    torus_invalid = (report.reasons & feasibility.REASON_BIT["torus_mapping_invalid"]) > 0
    q = feasibility.quantities(model, cluster, plan, report.dp, report.microbatches, report.memory_bytes,
                               torus_invalid)
    v = feasibility.margins(q)
    if spec.budget_usd > 0:
        budget = jnp.log(cost / budget_usd(spec, cluster))
        v = jnp.concatenate([v, jnp.broadcast_to(budget, v.shape[:-1])[..., None]], axis=-1)
    return v


def _feasible_exact(spec, model, cluster, plan, report, cost):
    ok = report.feasible > 0
    if spec.budget_usd > 0:
        ok = ok & (cost <= budget_usd(spec, cluster) * (1 + 1e-12))
    if spec.hold_params:   # a shape variable must leave whole heads
        ok = ok & (jnp.floor(model.heads) == model.heads) & (jnp.floor(model.kv_heads) == model.kv_heads)
    return ok


# ---------------------------------------------------------------- relaxed optimization


def _z_to_x(spec, u):
    """u in [0, 1] (projected after every step) -> log2 value z in [lo, hi] -> x = 2**z."""
    lo = jnp.array([v.lo for v in spec.free])
    hi = jnp.array([v.hi for v in spec.free])
    z = lo + (hi - lo) * u
    return {v.name: jnp.exp2(z[..., i]) for i, v in enumerate(spec.free)}


def _relaxed_loss(spec, model, cluster, u, cat_vals, k):
    x = _z_to_x(spec, u)
    cats = {n: cat_vals[i] for i, n in enumerate(spec.categorical)}
    m, c, p = build(spec, model, cluster, x, cats, exact=False)
    r = evaluate(m, c, p, spec.fidelity, sharpness=k)
    val, cost = objective(spec, m, c, p, r, sharpness=k)
    # an exact hinge (not the annealed one): a constrained optimum then sits on its boundary at
    # every sharpness instead of drifting toward it as k grows (the weight outbids the objective)
    viol = steps.relu(_violations(spec, m, c, p, r, cost))
    return jnp.log(val) + PENALTY_WEIGHT * jnp.sum(viol + viol ** 2, axis=-1)


def _cat_grid(spec):
    names = list(spec.categorical)
    combos = list(itertools.product(*[spec.categorical[n] for n in names])) or [()]
    return names, np.array(combos, dtype=float).reshape(len(combos), len(names))


def optimize(spec: Spec, model: ModelShape, cluster: Cluster):
    """Projected Adam from ``spec.starts`` uniform starts in the log2 box (categoricals
    round-robin), vmapped in one jit, sharpness annealed geometrically.

    Returns (u, cats, loss_history[steps, starts], moved[starts], x_history[steps, starts,
    vars]): ``moved`` is the largest change of any log2 variable over the last quarter of the
    steps; ``x_history`` the free variables (spec units) before each step.
    """
    _, combos = _cat_grid(spec)
    S = spec.starts
    key = jax.random.PRNGKey(spec.seed)
    u0 = jax.random.uniform(key, (S, len(spec.free)))
    cats = jnp.asarray(combos[np.arange(S) % len(combos)])
    k0, k1 = spec.sharpness
    T = spec.steps
    ks = k0 * (k1 / k0) ** (jnp.arange(T) / max(T - 1, 1))
    # the step size decays (cosine) to 1% so each start settles while the sharpness rises
    opt = optax.adam(optax.cosine_decay_schedule(spec.lr, T, alpha=0.01))

    def one(u, cat, k):
        return _relaxed_loss(spec, model, cluster, u, cat, k)

    vg = jax.vmap(jax.value_and_grad(one), in_axes=(0, 0, None))

    @jax.jit
    def run_all(u0, cats, ks):
        state = opt.init(u0)

        def body(carry, k):
            u, s = carry
            loss, g = vg(u, cats, k)
            x = jnp.stack(list(_z_to_x(spec, u).values()), -1)
            g = jnp.where(jnp.isfinite(g), g, 0.0)
            upd, s = opt.update(g, s, u)
            # projected Adam: the box [lo, hi] holds optima at a bound exactly (pp = 1, mbs = 1)
            return (jnp.clip(optax.apply_updates(u, upd), 0.0, 1.0), s), (loss, x)

        (u, _), (hist, xs) = jax.lax.scan(body, (u0, state), ks)
        # the last quarter of the steps runs at 1-15% of the initial step size: a start that
        # still drifts there moves well over CONVERGED_LOG2; one that settled does not
        tail = max(1, T // 4)
        z_end = jnp.log2(jnp.stack(list(_z_to_x(spec, u).values()), -1))
        moved = jnp.max(jnp.abs(z_end - jnp.log2(xs[T - tail])), axis=-1)
        return u, (hist, xs), moved

    u, (hist, xs), moved = run_all(u0, cats, ks)
    return u, cats, hist, moved, xs


# ---------------------------------------------------------------- exact evaluation, snapping


def _exact_batch(spec, model, cluster, xs: dict, cats: np.ndarray):
    """Exact objective (inf where infeasible) for a batch of allowed points."""
    x = {n: jnp.asarray(v) for n, v in xs.items()}
    cd = {n: jnp.asarray(cats[:, i]) for i, n in enumerate(spec.categorical)}
    m, c, p = build(spec, model, cluster, x, cd, exact=True)
    r = evaluate(m, c, p, spec.fidelity)
    val, cost = objective(spec, m, c, p, r)
    ok = _feasible_exact(spec, m, c, p, r, cost)
    return jnp.where(ok, val, jnp.inf)


def _values_arrays(spec):
    return [np.asarray(v.values) for v in spec.free]


def _neighbors(spec, u):
    """Index of the allowed value at or below, and above, each continuous optimum."""
    x = _z_to_x(spec, jnp.asarray(u))
    lo_idx, hi_idx = [], []
    for i, v in enumerate(spec.free):
        vals = np.log2(np.asarray(v.values))
        z = np.log2(np.asarray(x[v.name]))
        j = np.clip(np.searchsorted(vals, z + 1e-9, side="right") - 1, 0, len(vals) - 1)
        lo_idx.append(j)
        hi_idx.append(np.minimum(j + 1, len(vals) - 1))
    return np.stack(lo_idx, -1), np.stack(hi_idx, -1)


def _points(spec, idx):
    vals = _values_arrays(spec)
    return {v.name: vals[i][idx[:, i]] for i, v in enumerate(spec.free)}


class _Counter:
    """Exact evaluation of allowed points (one jit per case), counting every point."""

    def __init__(self, spec, model, cluster):
        self.spec, self.n = spec, 0
        self.fn = jax.jit(lambda xs, cats: _exact_batch(spec, model, cluster, xs, cats))

    def __call__(self, idx, cats, count=True):
        """Objective of each point (inf if infeasible); batches padded to a power of two."""
        n = len(idx)
        self.n += n if count else 0
        if not n:
            return np.zeros(0)
        size = max(1 << (n - 1).bit_length(), 1024)   # few distinct shapes: few compilations
        if size > n:
            idx = np.concatenate([idx, np.repeat(idx[-1:], size - n, 0)])
            cats = np.concatenate([cats, np.repeat(cats[-1:], size - n, 0)])
        return np.asarray(self.fn(_points(self.spec, idx), np.asarray(cats, dtype=float)))[:n]


def snap(spec, u, cats, ev: _Counter):
    """Corners of the allowed-value cell around each start (at most 2^8 per start)."""
    lo, hi = _neighbors(spec, u)
    n = len(spec.free)
    if n <= 8:
        masks = np.array(list(itertools.product([0, 1], repeat=n)), dtype=bool)
    else:  # nearest corner and its one-variable flips
        masks = np.vstack([np.zeros((1, n), bool), np.eye(n, dtype=bool)])
    idx = np.where(masks[None, :, :], hi[:, None, :], lo[:, None, :]).reshape(-1, n)
    cat = np.repeat(np.asarray(cats), len(masks), axis=0)
    key = np.concatenate([idx, cat], axis=1)
    key, first = np.unique(key, axis=0, return_index=True)
    idx, cat = idx[first], cat[first]
    vals = ev(idx, cat)
    return idx, cat, vals


def polish(spec, idx, cat, val, ev: _Counter, max_rounds=50):
    """Discrete local search: moves of one allowed value in one or two variables, or any
    categorical alternative, to the best neighbour until no move improves."""
    _, combos = _cat_grid(spec)
    n = len(spec.free)
    sizes = np.array([len(v.values) for v in spec.free])
    steps1 = [np.eye(n, dtype=int)[i] * s for i in range(n) for s in (-1, 1)]
    # pairs move along a budget line or a memory boundary (one up, one down, or both)
    # (two hardware variables trade along a budget line in steps of up to HW_TRADE levels)
    hw = [v.name in CLUSTER_VARS for v in spec.free]
    e = np.eye(n, dtype=int)
    steps2 = []
    for i in range(n):
        for j in range(i + 1, n):
            far = range(1, HW_TRADE + 1) if hw[i] and hw[j] else (1,)
            for a in (-1, 1):
                for b in (-1, 1):
                    steps2 += [e[i] * a + e[j] * b * f for f in far]
                    steps2 += [e[i] * a * f + e[j] * b for f in far if f > 1]
    for _ in range(max_rounds):
        moves = []
        for dlt in steps1 + steps2:
            j = idx + dlt
            if np.all((j >= 0) & (j < sizes)):
                moves.append((j, cat))
        for cb in combos:
            if not np.array_equal(cb, cat):
                moves.append((idx.copy(), np.asarray(cb)))
        if not moves:
            break
        mi = np.stack([m[0] for m in moves])
        mc = np.stack([m[1] for m in moves]).reshape(len(moves), -1)
        mv = ev(mi, mc)
        b = int(np.argmin(mv))
        if not mv[b] < val * (1 - 1e-12):
            break
        idx, cat, val = mi[b], mc[b], float(mv[b])
    return idx, cat, val


def exhaustive(spec, model, cluster, chunk=1 << 18):
    """Every allowed point, evaluated exactly in chunks. Returns (idx, cat, value, count)."""
    ev = _Counter(spec, model, cluster)
    _, combos = _cat_grid(spec)
    sizes = [len(v.values) for v in spec.free]
    n_num = int(np.prod(sizes)) if sizes else 1
    total = n_num * len(combos)
    best = (None, None, np.inf)
    for start in range(0, total, chunk):
        flat = np.arange(start, min(start + chunk, total))
        ci, ni = np.divmod(flat, n_num)
        idx = np.stack(np.unravel_index(ni, sizes), -1) if sizes else np.zeros((len(flat), 0), int)
        cat = combos[ci]
        v = ev(idx, cat)
        b = int(np.argmin(v))
        if v[b] < best[2]:
            best = (idx[b], cat[b], float(v[b]))
    return best[0], best[1], best[2], total


# ---------------------------------------------------------------- one case


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
    evaluations: int          # gradient steps x starts + exact evaluations (snap + polish)
    seconds: float
    exhaustive: Found | None = None
    exhaustive_evaluations: int = 0
    exhaustive_seconds: float = 0.0
    space_size: int = 0
    budget_usd: float = 0.0   # the total cost cap of this case (0: none)
    history: dict | None = None   # "loss" and each free variable, relaxed, [steps, starts] (plots)

    @property
    def gap(self):
        if self.exhaustive is None or self.gradient is None:
            return None
        return self.gradient.objective / self.exhaustive.objective - 1.0


@dataclasses.dataclass
class Result:
    spec: Spec
    cases: list


def _found(spec, model, cluster, idx, cat) -> Found | None:
    if idx is None:
        return None
    x = {v.name: jnp.asarray(v.values[int(idx[i])]) for i, v in enumerate(spec.free)}
    cd = {n: jnp.asarray(float(cat[i])) for i, n in enumerate(spec.categorical)}
    m, c, p = build(spec, model, cluster, x, cd, exact=True)
    r = evaluate(m, c, p, spec.fidelity)
    val, cost = objective(spec, m, c, p, r)
    if not bool(_feasible_exact(spec, m, c, p, r, cost)):
        return None   # never report an infeasible point
    return Found(values={k: float(v) for k, v in x.items()}, categorical={k: float(v) for k, v in cd.items()},
                 objective=float(val), cost_usd=float(cost), report=r, model=m, cluster=c, plan=p)


def space_size(spec) -> int:
    _, combos = _cat_grid(spec)
    return int(np.prod([len(v.values) for v in spec.free])) * len(combos)


def run_case(spec: Spec, label_model, model, label_cluster, cluster, *, exhaustive_search=True) -> Case:
    t0 = time.perf_counter()
    u, cats, hist, moved, xs = optimize(spec, model, cluster)
    hist, xs = np.asarray(hist), np.asarray(xs)
    # the relaxed trajectory for dse.plot.codesign_figures: loss and each free variable (spec units)
    history = {"loss": hist, **{v.name: xs[:, :, i] for i, v in enumerate(spec.free)}}
    ev = _Counter(spec, model, cluster)
    idx, cat, vals = snap(spec, np.asarray(u), np.asarray(cats), ev)
    # a start converged when no log2 variable moved more than CONVERGED_LOG2 over its last
    # quarter of steps (a gradient norm is no test here: at a relaxed kink it stays large)
    conv = np.asarray(moved) < CONVERGED_LOG2
    best_idx, best_cat, best_val = None, None, np.inf
    # polish the best snapped point of each of the best ``spec.polish`` distinct layouts (plan,
    # model and categorical values; hardware free), so one layout cannot crowd out the others
    layout = [i for i, v in enumerate(spec.free) if v.name not in CLUSTER_VARS]
    best_of = {}
    for j in np.argsort(vals):
        if not np.isfinite(vals[j]):
            break
        best_of.setdefault(tuple(idx[j, layout]) + tuple(cat[j]), j)
    for j in list(best_of.values())[: spec.polish]:
        pi, pc, pv = polish(spec, idx[j], cat[j], float(vals[j]), ev)
        if pv < best_val:
            best_idx, best_cat, best_val = pi, pc, pv
    if spec.polish == 0 and best_of:
        j = next(iter(best_of.values()))
        best_idx, best_cat, best_val = idx[j], cat[j], float(vals[j])
    grad_evals = spec.starts * spec.steps + ev.n
    found = _found(spec, model, cluster, best_idx, best_cat)
    case = Case(model=label_model, cluster=label_cluster, objective=spec.objective, gradient=found,
                relaxed_loss=float(np.min(hist[-1])), converged=bool(conv[np.argmin(hist[-1])]),
                starts_converged=int(conv.sum()), evaluations=grad_evals, history=history,
                seconds=time.perf_counter() - t0, space_size=space_size(spec))
    if exhaustive_search and 0 < case.space_size <= spec.exhaustive_max:
        t1 = time.perf_counter()
        ei, ec, _, n = exhaustive(spec, model, cluster)
        case.exhaustive = _found(spec, model, cluster, ei, ec)
        case.exhaustive_evaluations = n
        case.exhaustive_seconds = time.perf_counter() - t1
    return case


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
