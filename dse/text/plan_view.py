"""The seed's Expert view of one plan, as text: memory, a row per dimension, bubble,
compute, step, MFU, the network line and the sensitivity table (``dse plan``, notebooks)."""

from __future__ import annotations

import numpy as np

from dse.equations import schedule, topology, traffic
from dse.equations.degrees import folds_experts, hybrid_shard
from dse.inputs import FP8_NAMES, TOPOLOGIES, recompute_name
from dse.report import DIM_NAMES, REASONS, WARNINGS
from dse.text import fmt

__all__ = ["expert_view", "sensitivity_view", "network_line", "tier", "run_view"]


def sensitivity_view(sens: dict, step_s: float) -> str:
    """One row per cluster rate: value, d(step)/d(x) per display unit, elasticity."""
    from dse.engines import sensitivity   # jax.grad: imported only when sensitivities are shown
    lines = ["", f"{'sensitivity':<22}{'value':>14}{'d step / d x':>24}{'elasticity':>12}"]
    for field, row in sens.items():
        label, unit, factor = sensitivity.FIELDS[field]
        per_unit = row["d_step_dx"] / factor          # seconds per display unit
        lines.append(f"{label:<22}{row['value'] * factor:>10.4g} {unit:<7}"
                     f"{per_unit:>+14.4g} s/{unit:<8}{row['elasticity']:>+12.4f}")
    lines.append(f"elasticity: % change of the {fmt.seconds(step_s)} step per % change of the rate")
    return "\n".join(lines)


def run_view(run: dict) -> str:
    """A whole training run: tokens, days, GPU-hours, cost, goodput and the failure model behind it."""
    days = run["time_to_train_s"] / 86400.0
    cost = f"  ${run['cost_usd']:,.0f} at ${run['usd_per_gpu_hour']:g}/GPU-h" if run["usd_per_gpu_hour"] > 0 else ""
    return "\n".join([
        f"run       {fmt.count(run['tokens'])} tokens: {days:,.2f} days  {run['gpu_hours']:,.0f} GPU-hours{cost}",
        f"goodput   {100 * run['goodput']:.1f}% (checkpoint every {run['checkpoint_interval_s'] / 60:.1f} min, "
        f"{run['interruptions']:,.0f} interruptions expected; failure rate {run['failure_rate_per_gpu_hour']:.3g}"
        f"/GPU-h, write {run['checkpoint_write_s']:g} s, restart {run['restart_s']:g} s)"])


def tier(inside: bool, size: float) -> str:
    if size <= 1:
        return "-"
    return "scale-up" if inside else "scale-out"


def _tier(k: str, out: dict, cluster, plan) -> str:
    """The tier column: scale-up / scale-out, or torus, or hierarchical for a split DP all-reduce."""
    size = out["group_size"][k]
    if size > 1 and float(np.asarray(cluster.topology)) == TOPOLOGIES["torus"]:
        return "torus"
    if size > 1 and out["scale_up_bytes"][k] > 0 and out["scale_out_bytes"][k] > 0:
        return "up+out"
    return tier(out["inside_domain"][k], size)


def network_line(cluster, plan, out: dict) -> str:
    """Topology, rank order, bytes a rank puts on the scale-out network, and the network's cost."""
    f = lambda x: float(np.asarray(x))  # noqa: E731
    topo = {v: k for k, v in TOPOLOGIES.items()}[f(cluster.topology)]
    if topo == "torus":
        desc = "torus " + "x".join(f"{f(n):g}" for n in (cluster.torus_x, cluster.torus_y, cluster.torus_z) if f(n) > 1)
        desc += f", fill {''.join(topology.AXES[a] for a in topology.TORUS_ORDERS[int(f(plan.torus_order))])}"
    elif topo == "fat-tree" and 0 < f(cluster.island_gpus) < f(cluster.gpus):
        desc = f"three tiers: domain {f(cluster.domain):g}, islands of {f(cluster.island_gpus):g}, core {f(cluster.oversubscription):g}:1"
    else:
        desc = f"{topo}, domain {f(cluster.domain):g}"
    order = ",".join(topology.rank_order_names(f(plan.rank_order)))
    hier = "  DP hierarchical" if f(plan.dp_hierarchical) else ""
    n = f(cluster.gpus)
    return (f"network   {desc}  order {order}{hier}  scale-out {fmt.bytes_(sum(out['scale_out_bytes'].values()))}/rank"
            f"  cost ${out['network_cost_usd'] / 1e6:,.1f}M (${out['network_cost_usd'] / n:,.0f}/GPU)"
            f"  {out['network_power_w'] / 1e3:,.0f} kW")


def _fp8_text(plan, cluster) -> str:
    """'  FP8 delayed (FP8 params, TP gathers in FP8)' when the plan trains in FP8, else ''."""
    code = float(np.asarray(plan.fp8))
    if not code:
        return ""
    if not float(np.asarray(cluster.peak_fp8_flops_per_s)):
        return f"  FP8 {FP8_NAMES[code]} (no FP8 path on this cluster: 16-bit)"
    on = lambda k: float(np.asarray(getattr(plan, k))) > 0  # noqa: E731
    said = ["FP8 params"] if on("fp8_param_gather") else []
    said += ["FP8 TP gathers"] if on("fp8_tp_comm") and on("sp") and float(np.asarray(plan.tp)) > 1 else []
    if not float(np.asarray(plan.fp8_cache)):
        said.append("re-cast in backward")
    return f"  FP8 {FP8_NAMES[code]}" + (f" ({', '.join(said)})" if said else "")


# The parts of "other" memory as the plan view names them (Report.<key>_bytes).
BUFFER_LABELS = (("logits", "logits"), ("tp_buffer", "SP gather"), ("dp_buffer", "DP/ZeRO buffers"),
                 ("nccl", "NCCL"), ("context", "CUDA context"), ("fragmentation", "fragmentation"))


def offload_line(cluster, plan, out: dict) -> str:
    """What the plan offloads, the host memory a node needs, and the time it adds (dse/equations/offload.py)."""
    f = lambda x: float(np.asarray(x))  # noqa: E731
    what = [name for name, on in (("optimizer", f(plan.offload_optimizer)), ("gradients", f(plan.offload_gradients)),
                                  ("weights", f(plan.offload_weights) * (f(plan.zero) >= 3)),
                                  ("activations", f(plan.offload_activations))) if on]
    shares = {"optimizer": f(plan.offload_optimizer), "activations": f(plan.offload_activations)}
    desc = ", ".join(f"{w} {100 * shares[w]:g}%" if w in shares and shares[w] < 1 else w for w in what)
    return (f"offload   {desc}: host {fmt.bytes_(out['host_bytes'])}/rank, {fmt.bytes_(out['node_host_bytes'])}/node"
            f" of {fmt.bytes_(f(cluster.node_host_bytes))}; host link {f(cluster.host_link_bytes_per_s) / 1e9:g} GB/s;"
            f" host Adam {fmt.seconds(out['host_optimizer_s'])}; adds {fmt.seconds(out['offload_s'])} to the step")


def _hybrid_text(plan, d) -> str:
    """' (HSDP: sharded over s, r replicas)' where the plan shards hybrid (degrees.hybrid_shard), else ''."""
    h = hybrid_shard(d, plan)
    if h is None or float(np.asarray(h[1])) <= 1:
        return ""
    return f" (HSDP: sharded over {float(np.asarray(h[0])):g}, {float(np.asarray(h[1])):g} replicas)"


def expert_view(model, cluster, plan, out: dict) -> str:
    """The seed's Expert view: memory, a row per dimension, bubble, compute, step, MFU."""
    f = lambda x: float(np.asarray(x))  # noqa: E731
    t, c, e, p, v = (f(plan.tp), f(plan.cp), f(plan.ep), f(plan.pp), f(plan.vpp))
    lines = []
    lines.append(f"plan      N={f(cluster.gpus):g}  t={t:g} c={c:g} e={e:g} p={p:g} d={out['dp']:g}"
                 f"  b={f(plan.mbs):g} B={f(plan.gbs):g} m={out['microbatches']:g} v={v:g}"
                 f"  ZeRO-{f(plan.zero):g}" + _hybrid_text(plan, out["dp"])
                 + f"  recompute={recompute_name(f(plan.recompute), f(plan.recompute_every), f(plan.recompute_modules))}"
                 f"  SP={'on' if f(plan.sp) else 'off'}" + _fp8_text(plan, cluster)
                 + ("  EP dispatch in FP8" if f(plan.ep_fp8_dispatch) and f(plan.ep) > 1 else "")
                 + ("  EP folded over TP (ETP 1)" if folds_experts(plan) else "")
                 + ("  EP dispatch once a node" if f(plan.ep_node_dedup) and f(plan.ep) > 1 else ""))
    lines.append(f"params    total {fmt.count(out['params_total'])}  active {fmt.count(out['params_active'])}"
                 f"  per rank {fmt.count(out['params_per_rank'])}")
    mem = out["memory_bytes"]
    hbm = f(cluster.hbm_bytes)
    lines.append("memory    " + "  ".join(f"{k} {fmt.bytes_(mem[k])}" for k in ("weights", "grads", "optimizer", "activations"))
                 + (f"  other {fmt.bytes_(mem['other'])}" if mem["other"] else "")
                 + f"  = {fmt.bytes_(mem['total'])} of {fmt.bytes_(hbm)} "
                 + ("(fits)" if out["fits"] else "(DOES NOT FIT)"))
    if mem["other"]:   # other, part by part (dse/equations/memory.py)
        parts = [(label, mem[key]) for key, label in BUFFER_LABELS if mem[key]]
        lines.append("  other   " + "  ".join(f"{label} {fmt.bytes_(x)}" for label, x in parts))
    if out["node_host_bytes"] or out["offload_s"]:
        lines.append(offload_line(cluster, plan, out))
    names = traffic.collective_names(bool(f(plan.sp)), int(f(plan.zero)))
    lines.append("")
    lines.append(f"{'dim':<4}{'size':>6}  {'collective':<28}{'tier':<11}{'bytes/step':>12}{'calls':>9}{'message':>11}{'wire':>11}{'exposed':>11}")
    for k in DIM_NAMES:
        size = out["group_size"][k]
        lines.append(f"{k:<4}{size:>6g}  {names[k] if size > 1 else '-':<28}{_tier(k, out, cluster, plan):<11}"
                     f"{fmt.bytes_(out['traffic_bytes'][k]):>12}{out['calls_per_step'][k]:>9g}"
                     f"{fmt.bytes_(out['message_bytes'][k]) if size > 1 else '-':>11}"
                     f"{fmt.seconds(out['wire_s'][k]):>11}{fmt.seconds(out['exposed_s'][k]):>11}")
    lines.append("")
    lines.append(f"compute   {fmt.seconds(out['compute_s'])}  ({out['hardware_flops'] / f(cluster.gpus) / 1e12:.1f} TFLOP a rank"
                 f" at {f(cluster.peak_flops_per_s) / 1e12:g} TFLOP/s)")
    sched = schedule.BUBBLE_FORMULAS[int(f(plan.schedule))]
    lines.append(f"bubble    {sched} = {out['bubble_fraction']:.4f}  -> {fmt.seconds(out['bubble_s'])},"
                 f" {100 * out['bubble_share']:.1f}% of the step")
    exposed = sum(out["exposed_s"].values())
    lines.append(f"exposed   {fmt.seconds(exposed)} of communication")
    lines.append(f"step      {fmt.seconds(out['step_s'])}   tokens/s {out['tokens_per_s']:,.0f}   MFU {100 * out['mfu']:.1f}%")
    lines.append(network_line(cluster, plan, out))
    if out["infeasible_reasons"]:
        msg = dict(REASONS)
        lines.append("INFEASIBLE: " + "; ".join(msg[r] for r in out["infeasible_reasons"]))
    if out["warnings"]:
        msg = dict(WARNINGS)
        for w in out["warnings"]:
            lines.append(f"warning: {msg[w]}")
    return "\n".join(lines)
