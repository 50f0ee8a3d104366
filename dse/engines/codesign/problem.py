"""The co-design problem: inputs from free variables, the objective, hardware cost, feasibility.

Everything here calls ``evaluate`` and the equation modules; nothing restates a rule. The
budget is an argument (a traced scalar), so one compiled function serves every budget of a
spec (the epsilon-constraint front).
"""

from __future__ import annotations


from dse.backend import jnp
from dse.engines.codesign.spec import CLUSTER_VARS, PLAN_VARS, Spec
from dse.equations import goodput as gp
from dse.equations import cost as netcost
from dse.equations import feasibility, memory, steps
from dse.inputs import Cluster, ModelShape, Plan

__all__ = ["build", "hardware_cost_usd", "budget_usd", "log_over_budget", "objective", "violations",
           "feasible_exact", "projects_budget", "penalty_reads_cost"]


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


def _cluster(cluster: Cluster, x: dict) -> Cluster:
    """The cluster with the free hardware variables of ``x`` (spec units) set."""
    cl = {}
    for name, val in x.items():
        if name in CLUSTER_VARS:
            field, factor = CLUSTER_VARS[name]
            cl[field] = val * factor
    return cluster.replace(**cl) if cl else cluster


def build(spec: Spec, model: ModelShape, cluster: Cluster, x: dict, cats: dict, exact: bool, fid=None):
    """(model, cluster, plan) with free variables ``x`` (spec units) and categoricals ``cats``."""
    fid = spec.fidelity if fid is None else fid
    cluster = _cluster(cluster, x)
    if "hidden" in x:
        model = _shape_model(model, fid, x["hidden"], spec.hold_params, exact)
    if "topk" in x and spec.hold_params:
        # active expert parameters ~ topk x expert FFN width (seed 000 sec.1): hold their product
        model = model.replace(expert_ffn_hidden=model.expert_ffn_hidden * model.topk / x["topk"])
    mf = {k: x[k] for k in ("layers", "experts", "topk") if k in x}
    model = model.replace(**mf) if mf else model
    pf = dict(spec.plan)
    pf.update({k: x[k] for k in PLAN_VARS if k in x})
    pf.update(cats)
    pf.setdefault("mbs", 1.0)
    pf.setdefault("tp", 1.0)
    pf.setdefault("pp", 1.0)
    return model, cluster, Plan.make(**pf)


def hardware_cost_usd(spec: Spec, cluster: Cluster, report, sharpness=None):
    """Total hardware cost: the spec's linear prices (USD per unit of each cluster field per
    accelerator) times N, plus the network model with ``network = true``: the report's
    (Report.network_cost_usd, dse/equations/cost.py; relaxed when ``evaluate`` was), or, without a
    report, the model itself at ``sharpness`` (cost.relaxed_sharpness)."""
    per_gpu = jnp.zeros_like(cluster.gpus)
    for var, price in spec.prices.items():
        field, factor = CLUSTER_VARS[var]
        per_gpu = per_gpu + price * (getattr(cluster, field) / factor if var != "gpus" else 1.0)
    total = per_gpu * cluster.gpus
    if spec.network_cost:
        # a report's cost where its evaluate priced the network, else the USD alone (the relaxed loss:
        # evaluate(network_cost=False), so the cost model is traced once and without its power)
        total = total + (report.network_cost_usd if report is not None
                         else netcost.network_usd(cluster, netcost.relaxed_sharpness(sharpness)))
    return total


def budget_usd(spec: Spec, cluster: Cluster, budget=None):
    """The cost cap of this cluster (per-accelerator budgets scale with N); ``budget``
    overrides spec.budget_usd (a traced scalar inside the compiled functions)."""
    b = spec.budget_usd if budget is None else budget
    return b * (cluster.gpus if spec.budget_per_gpu else 1.0)


def log_over_budget(spec: Spec, cluster: Cluster, x: dict, budget, sharpness):
    """log(relaxed hardware cost / cap) of the hardware in ``x``: the budget constraint (<= 0) the
    optimizer projects onto. The cost depends on the cluster only, so no ``evaluate`` is needed."""
    c = _cluster(cluster, x)
    return jnp.log(hardware_cost_usd(spec, c, None, sharpness) / budget_usd(spec, c, budget))


def objective(spec: Spec, model, cluster, plan, report, sharpness=None, report_priced=True, cost=True):
    """(value, cost): the quantity minimized, in its own units, and the hardware cost (from the
    report's network cost, or, ``report_priced`` False, the cost model's USD: ``hardware_cost_usd``).
    ``cost`` False: the caller does not read the cost (``penalty_reads_cost``), so it is zero unless
    the value itself prices it (``step_time_cost``): the relaxed loss of a step-time objective whose
    budget the optimizer projects onto then traces no cost model (607 of 4,935 operations of
    ratio_dense's forward pass, each also differentiated)."""
    priced = (spec.prices or spec.network_cost) and (cost or spec.objective == "step_time_cost")
    cost = (hardware_cost_usd(spec, cluster, report if report_priced else None, sharpness) if priced
            else jnp.zeros_like(report.step_s))
    if spec.objective == "step_time":
        return report.step_s, cost
    if spec.objective == "time_to_train":
        g = gp.goodput(cluster.gpus, spec.failure_rate_per_gpu_s, spec.checkpoint_write_s, spec.restart_s,
                       sharpness=sharpness)
        return gp.time_to_train_s(spec.tokens, report.tokens_per_s, g), cost
    # step_time_cost: step * cost^w, scale-free; w sweeps the Pareto front
    return report.step_s * cost ** spec.cost_weight, cost


def violations(spec, model, cluster, plan, report, cost, budget=None, with_budget=True):
    """Signed margins (> 0 is infeasible) of the feasibility table's rules
    (dse/equations/feasibility.py), plus the budget's log-ratio (unless ``with_budget`` is False:
    the optimizer that projects onto the budget line leaves it out of the penalty)."""
    torus_invalid = (report.reasons & feasibility.REASON_BIT["torus_mapping_invalid"]) > 0
    q = feasibility.quantities(model, cluster, plan, report.dp, report.microbatches, report.memory_bytes,
                               torus_invalid)
    v = feasibility.margins(q)
    if spec.budget_usd > 0 and with_budget:
        over = jnp.log(cost / budget_usd(spec, cluster, budget))
        shape = jnp.broadcast_shapes(v.shape[:-1], jnp.shape(over))   # the plan's rules may not vary with the hardware
        v = jnp.concatenate([jnp.broadcast_to(v, shape + v.shape[-1:]), jnp.broadcast_to(over, shape)[..., None]], axis=-1)
    return v


def feasible_exact(spec, model, cluster, plan, report, cost, budget=None):
    ok = report.feasible > 0
    if spec.budget_usd > 0:
        ok = ok & (cost <= budget_usd(spec, cluster, budget) * (1 + 1e-12))
    if spec.hold_params:   # a shape variable must leave whole heads
        ok = ok & (jnp.floor(model.heads) == model.heads) & (jnp.floor(model.kv_heads) == model.kv_heads)
    return ok


def penalty_reads_cost(spec: Spec) -> bool:
    """Whether the relaxed loss's penalty reads the hardware cost: a budget the optimizer does not
    project onto (``violations`` with the budget)."""
    return spec.budget_usd > 0 and not projects_budget(spec)


def projects_budget(spec: Spec) -> bool:
    """Whether the optimizer holds the budget by projection (a budget and free hardware to spend it on)."""
    return spec.budget_usd > 0 and any(v.name in CLUSTER_VARS for v in spec.free)


def relaxed_penalty(viol):
    """Exact hinge on each log-violation, linear plus squared (not the annealed one): a constrained
    optimum then sits on its boundary at every sharpness instead of drifting toward it."""
    h = steps.relu(viol)
    return jnp.sum(h + h ** 2, axis=-1)
