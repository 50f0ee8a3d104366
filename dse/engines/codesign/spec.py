"""The co-design spec: free variables, objective, cost, search settings, parsed from TOML.

Spec format: see ``sweeps/codesign_*.toml`` and README "Co-design". Bad input raises
``InputError`` with one line naming the field and the allowed values.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from dse.equations import goodput as gp
from dse.equations import topology
from dse.errors import InputError
from dse.inputs import RECOMPUTE, SCHEDULES, Cluster, ModelShape, Plan, checks, presets
from dse.inputs.fidelity import default_mode, resolve

__all__ = ["Spec", "Var", "parse_spec", "load_spec", "OBJECTIVES", "PLAN_VARS", "CLUSTER_VARS", "MODEL_VARS",
           "CATEGORICAL_VARS", "PERMUTATION_VARS", "CATEGORICAL_MODES"]

OBJECTIVES = ("step_time", "time_to_train", "step_time_cost")
PLAN_VARS = ("tp", "pp", "cp", "ep", "mbs", "vpp")
# spec name -> (Cluster field, factor to SI), the presets' units (GB/s, GB, TFLOP/s, TB/s, us).
CLUSTER_VARS = {k: v for k, v in presets.CLUSTER_UNITS.items()
                if k in ("gpus", "tflops", "hbm_GB", "hbm_TBps", "domain", "bw_up_GBps", "bw_out_GBps",
                         "alpha_up_us", "alpha_out_us", "torus_bw_x_GBps", "torus_bw_y_GBps",
                         "torus_bw_z_GBps", "island_gpus", "oversubscription")}
# hidden: layers follow to hold the parameter count (heads, FFN widths scale with h);
# topk: the expert FFN width follows to hold the active parameters (experts may move freely).
MODEL_VARS = ("hidden", "layers", "experts", "topk")
# Categorical plan fields: name -> {option name: Plan code}. torus_order: which physical axis
# each rank stride fills first (dse/equations/topology.py TORUS_ORDERS); rank_order: the order
# of the parallel dimensions in the rank (topology.RANK_ORDERS, innermost first).
CATEGORICAL_VARS = {"zero": {"0": 0.0, "1": 1.0, "2": 2.0, "3": 3.0}, "recompute": RECOMPUTE,
                    "schedule": SCHEDULES,
                    "torus_order": {"".join(topology.AXES[i] for i in perm): float(code)
                                    for code, perm in enumerate(topology.TORUS_ORDERS)},
                    "rank_order": {",".join(topology.DIMS[i] for i in perm): float(code)
                                   for code, perm in enumerate(topology.RANK_ORDERS)},
                    "dp_hierarchical": {"0": 0.0, "1": 1.0}}
# Permutation-valued categoricals, relaxed as doubly-stochastic (Sinkhorn) matrices: name ->
# the table of permutations their codes index.
PERMUTATION_VARS = {"torus_order": topology.TORUS_ORDERS, "rank_order": topology.RANK_ORDERS}
# search.categorical: "relax" (softmax / Sinkhorn weights blended inside the loss, one start
# optimizes every categorical), or "starts" (one combination per start, round-robin).
CATEGORICAL_MODES = ("relax", "starts")
# Integer-valued variables default to powers of two; the others to log-spaced levels.
_POW2_DEFAULT = set(PLAN_VARS) | {"gpus", "domain", "experts", "topk", "island_gpus"}


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
    network_cost: bool                           # add Report.network_cost_usd (dse/equations/cost.py)
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
    categorical_mode: str = "relax"
    baseline: bool = False                       # also run the non-gradient baseline (random starts + local search)

    @property
    def names(self):
        return tuple(v.name for v in self.free)


# ---------------------------------------------------------------- small readers


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


def _as_list(x):
    return x if isinstance(x, list) else [x]


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
        if name == "rank_order" and key not in table:
            try:
                key = ",".join(topology.rank_order_names(topology.rank_order_code(key)))
            except InputError:
                pass
        if key not in table:
            allowed = ", ".join(table) if len(table) <= 8 else "orders of " + ",".join(topology.DIMS)
            raise InputError(f"free.{name}: unknown {it!r}; allowed: {allowed}")
        out.append(table[key])
    if not out:
        raise InputError(f"free.{name}: give at least one value")
    return tuple(sorted(set(out)))


# ---------------------------------------------------------------- the tables of a spec


def _models(raw):
    mt = _table(raw, "model")
    overrides = {k: v for k, v in mt.items() if k not in ("preset", "presets")}
    names = _as_list(mt.get("presets", mt.get("preset", [])))
    if names:
        return tuple((n, presets.load_model(n, **overrides)) for n in names)
    return (("model", presets.model_from_fields(overrides)),)


def _clusters(raw):
    """A preset with overrides; gpus may be a list (one case each). Returns (base, clusters)."""
    ct = dict(_table(raw, "cluster"))
    base = ct.pop("preset", "seed")
    out = []
    for g in _as_list(ct.pop("gpus", None)):
        c = presets.load_cluster(base, **({"gpus": g} if g is not None else {}), **ct)
        out.append((f"{base} N={float(c.gpus):g}", c))
    return base, tuple(out)


def _plan(raw):
    plan = dict(_table(raw, "plan"))
    bad = set(plan) - set(Plan.__dataclass_fields__)
    if bad:
        raise InputError(f"plan: unknown field(s) {sorted(bad)}; allowed: {', '.join(Plan.__dataclass_fields__)}")
    for name in ("recompute", "schedule"):
        if name in plan:
            plan[name] = _categorical(name, plan[name])[0]
    plan = {k: _number(f"plan.{k}", v, 0) for k, v in plan.items()}
    if "gbs" not in plan:
        raise InputError("plan.gbs: required (the global batch in sequences is fixed by optimization)")
    return plan


def _objective(raw):
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
    per_gpu = "budget_usd_per_gpu" in ot
    budgets = tuple(_number("objective.budget_usd", b, 0)
                    for b in _as_list(ot.get("budget_usd_per_gpu", ot.get("budget_usd", 0.0))))
    if not budgets:
        raise InputError("objective.budget_usd: give a number or a non-empty list")
    return dict(objective=kind, tokens=tokens, cost_weight=cost_weight, budget_usd=budgets[0],
                budget_per_gpu=per_gpu, budgets=budgets)


def _cost(raw):
    cost_t = dict(_table(raw, "cost"))
    network = bool(cost_t.pop("network", False))
    prices = {}
    for k, v in cost_t.items():
        if not k.startswith("usd_per_"):
            raise InputError(f"cost.{k}: unknown; allowed: network, usd_per_<var> (usd_per_gpus: per accelerator, usd_per_bw_up_GBps, ...)")
        var = k[len("usd_per_"):]
        if var not in CLUSTER_VARS:
            raise InputError(f"cost.{k}: {var!r} is not a cluster field; allowed: {', '.join(CLUSTER_VARS)}")
        prices[var] = _number(f"cost.{k}", v, 0)
    return dict(prices=prices, network_cost=network)


def _goodput(raw):
    gt = _table(raw, "goodput")
    rate = _number("goodput.failure_rate_per_gpu_hour", gt.get("failure_rate_per_gpu_hour",
                                                               gp.LLAMA3_FAILURE_RATE_PER_GPU_S * 3600), 0) / 3600.0
    return dict(failure_rate_per_gpu_s=rate,
                checkpoint_write_s=_number("goodput.checkpoint_write_s", gt.get("checkpoint_write_s", gp.CHECKPOINT_WRITE_S), 0),
                restart_s=_number("goodput.restart_s", gt.get("restart_s", gp.RESTART_S), 0))


def _free(raw, models, clusters, plan):
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
    return tuple(free), cats


def _search(raw, base):
    st = dict(_table(raw, "search"))
    known = {"fidelity", "sharpness", "starts", "steps", "lr", "seed", "exhaustive_max", "polish", "hold_params",
             "categorical", "baseline"}
    bad = set(st) - known
    if bad:
        raise InputError(f"search: unknown key(s) {sorted(bad)}; allowed: {', '.join(sorted(known))}")
    fid = st.get("fidelity") or default_mode(base if isinstance(base, str) else None)
    try:
        fidelity = resolve(fid)
    except InputError:
        raise InputError(f"search.fidelity: unknown {fid!r}; allowed: seed, calibrated") from None
    sharp = tuple(_number("search.sharpness", s, 1e-6) for s in _as_list(st.get("sharpness", [4.0, 200.0])))
    if len(sharp) == 1:
        sharp = (sharp[0], sharp[0])
    mode = st.get("categorical", "relax")
    if mode not in CATEGORICAL_MODES:
        raise InputError(f"search.categorical: unknown {mode!r}; allowed: {', '.join(CATEGORICAL_MODES)}")
    return dict(
        fidelity=fidelity,
        starts=int(_number("search.starts", st.get("starts", 32), 1)),
        steps=int(_number("search.steps", st.get("steps", 200), 1)),
        lr=_number("search.lr", st.get("lr", 0.03), 1e-9),
        sharpness=sharp[:2],
        seed=int(_number("search.seed", st.get("seed", 0), 0)),
        exhaustive_max=int(_number("search.exhaustive_max", st.get("exhaustive_max", 5_000_000), 0)),
        polish=int(_number("search.polish", st.get("polish", 6), 0)),
        hold_params=bool(st.get("hold_params", True)),
        categorical_mode=mode, baseline=bool(st.get("baseline", False)))


def parse_spec(raw: dict) -> Spec:
    """Validate a co-design spec (a dict read from TOML). Bad input raises InputError."""
    known = {"model", "cluster", "plan", "objective", "free", "cost", "goodput", "search"}
    unknown = set(raw) - known
    if unknown:
        raise InputError(f"codesign: unknown table(s) {sorted(unknown)}; allowed: {', '.join(sorted(known))}")
    models = _models(raw)
    base, clusters = _clusters(raw)
    plan = _plan(raw)
    obj = _objective(raw)
    cost = _cost(raw)
    if (obj["objective"] == "step_time_cost" or obj["budget_usd"] > 0) and not cost["prices"] and not cost["network_cost"]:
        raise InputError("cost: step_time_cost and budget_usd need prices (usd_per_<field>) or network = true")
    free, cats = _free(raw, models, clusters, plan)
    return Spec(models=models, clusters=clusters, plan=plan, **obj, **cost, **_goodput(raw),
                free=free, categorical=cats, **_search(raw, base))


def load_spec(path) -> Spec:
    return parse_spec(presets.read_toml(path, "codesign"))
