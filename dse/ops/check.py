"""The four questions that settle a plan (seed 001, "Tradeoffs and Decision Framework").

1. Does the TP degree fit inside one node (one NVLink domain)?
2. Does the job fit inside one island, and if not, is DP the only dimension that
   crosses the oversubscribed tier?
3. Does the gradient all-reduce hide behind the backward pass at the measured bus
   bandwidth?
4. Is the microbatch count at least four times the pipeline depth?

Plus the plan-visible failure modes of seed 001: TP above GPUs per node, an MoE
all-to-all across islands, too few microbatches for the pipeline, and the plan not
fitting memory. Every figure comes from ``dse.evaluate``'s Report; placement uses
``dse.equations.topology`` (strides, the inside-a-group rule) through the rank map.

Thresholds (documented, seed-derived where the seed gives one):
- Q1 FAIL when a TP group leaves the scale-up domain; WARN when it stays inside the
  domain but spans servers (a domain larger than a node, e.g. NVL72).
- Q2 PASS when the job fits an island or only DP crosses; WARN when PP crosses
  (seed 001 table: PP wants the same island); FAIL when TP, CP or EP crosses.
- Q3 PASS when DP wire time is at most 80% of the backward window it hides behind
  (Fidelity.dp_overlap x compute, 2/3 in seed mode); WARN when it hides with less
  headroom, or is exposed by under 10% of the step; FAIL above that.
- Q4 PASS when p = 1 or m >= 4p; WARN when p <= m < 4p; FAIL when m < p (the
  pipeline never fills).
"""

from __future__ import annotations

import numpy as np

from dse.backend import host_when_concrete
from dse.equations import schedule, topology
from dse.equations.degrees import hybrid_shard, rank_dims
from dse.errors import InputError
from dse.evaluate import derived, evaluate
from dse.inputs.fidelity import resolve
from dse.ops import rankmap
from dse.ops.verdict import FAIL, PASS, WARN, Verdict
from dse.report import REASONS

__all__ = ["four_questions", "HEADROOM", "EXPOSED_FAIL_SHARE", "MICROBATCHES_PER_STAGE"]

HEADROOM = 0.8               # Q3: DP wire time under 80% of the backward window is PASS
EXPOSED_FAIL_SHARE = 0.10    # Q3: exposed DP above 10% of the step is FAIL
MICROBATCHES_PER_STAGE = 4   # Q4: seed 001, "microbatches at least four times the pipeline depth"


def _f(x) -> float:
    return float(np.asarray(x))


def _gb(x: float) -> str:
    return f"{x / 1e9:.2f} GB"


def _s(x: float) -> str:
    return f"{x:.3f} s" if x >= 0.1 else f"{x * 1e3:.2f} ms"


@host_when_concrete   # concrete plans (evaluate's derived degrees): numpy, no eager XLA op where jax is imported
def plan_rank_map(cluster, plan) -> rankmap.RankMap:
    return rankmap.rank_map(**rank_dims(cluster, plan), gpus_per_node=int(_f(cluster.gpus_per_node)),
                            order=topology.rank_order_names(plan.rank_order))


@host_when_concrete   # one concrete plan: the Report and the placement in numpy, whether or not jax is imported
def four_questions(model, cluster, plan, fidelity="seed", *, busbw_bytes_per_s=None, rank_map=None) -> dict:
    """The verdicts and the Report they came from (with ``busbw`` on DP's tier when given).

    ``rank_map``: how the launcher places ranks (default: the plan's order, consecutive
    ranks per node, which is what ``evaluate`` assumes).
    """
    fid = resolve(fidelity)
    base = evaluate(model, cluster, plan, fid)
    dp_inside = _f(base.inside_domain.dp) > 0.5
    if busbw_bytes_per_s and _f(cluster.topology) == 2:
        raise InputError("--busbw: a torus times DP on its axis links; allowed: --busbw on a switched fabric, "
                         "--torus-bw on a torus")
    if busbw_bytes_per_s:
        tier = "bw_up_bytes_per_s" if dp_inside else "bw_out_bytes_per_s"
        cluster = cluster.replace(**{tier: busbw_bytes_per_s})
    r = evaluate(model, cluster, plan, fid)
    rm = rank_map or plan_rank_map(cluster, plan)
    out = [_q1(r, cluster, rm), _q2(r, cluster, plan), _q3(r, cluster, plan, fid, busbw_bytes_per_s, dp_inside),
           _q4(r, plan), _memory(r, cluster)]
    return {"verdicts": out, "report": r, "cluster": cluster, "rank_map": rm}


def _q1(r, cluster, rm) -> Verdict:
    t, g, U = rm.sizes["tp"], rm.gpus_per_node, _f(cluster.domain)
    name = "TP inside one node"
    tp_bytes, wire, step = _f(r.traffic_bytes.tp), _f(r.wire_s.tp), _f(r.step_s)
    cost = f"TP moves {_gb(tp_bytes)} a rank a step, {_s(wire)} on the wire ({100 * wire / step:.1f}% of the step)"
    if t == 1:
        return Verdict(name, PASS, "no tensor parallelism (TP 1)")
    spanning = rm.groups_spanning_nodes("tp")
    inside = _f(r.inside_domain.tp) > 0.5
    if not inside:
        why = f"TP {t} is above {g} GPUs per node" if t > g else f"TP {t} groups leave the domain of {U:g}"
        return Verdict(name, FAIL, f"{why}: the TP (and SP) collectives go over the NIC; {cost}",
                       ("seed 001: 'there is no configuration knob that makes it acceptable for them not to be'",))
    if len(spanning) and U <= g:
        return Verdict(name, FAIL, f"{len(spanning)} of {len(rm.groups('tp'))} TP groups span nodes under "
                                   f"{rm.assignment} assignment, order {','.join(rm.order)} (first: ranks "
                                   f"{rankmap.format_ranks(spanning[0])}): their collectives go over the NIC; {cost} if they "
                                   f"stayed inside", ("seed 001: 'Assuming consecutive global ranks are physically "
                                                     "adjacent'",))
    if len(spanning):
        return Verdict(name, WARN, f"TP {t} stays inside the scale-up domain of {U:g} but spans servers of {g}; {cost}")
    return Verdict(name, PASS, f"TP {t} <= {g} GPUs per node; all {len(rm.groups('tp'))} TP groups sit on one node "
                               f"each; {cost}")


def _q2(r, cluster, plan) -> Verdict:
    name = "job inside one island"
    N, island, over = _f(cluster.gpus), _f(cluster.island_gpus), _f(cluster.oversubscription)
    if island <= 0 or N <= island:
        what = "the cluster is one non-blocking island (island_gpus = 0)" if island <= 0 else \
            f"{N:g} GPUs fit one island of {island:g}"
        return Verdict(name, PASS, what)
    grp = _dp_groups(cluster, plan)          # the same placement evaluate times
    groups = [k for k in (*topology.DIMS, "dp_replica") if k in grp and _f(grp[k]["size"]) > 1
              and _f(grp[k]["in_island"]) < 0.5]
    crossing = list(dict.fromkeys("dp" if k == "dp_replica" else k for k in groups))   # HSDP's replicas are DP
    wire = r.wire_s.to_dict()
    def span(k):
        reach = f"{_f(grp[k]['stride']) * _f(grp[k]['size']):g} ranks"
        if k == "dp_replica":   # the replica all-reduce's wire time is counted in DP's
            return f"DP's replica groups span {reach}, {_s(_f(wire['dp']))} on the wire (all of DP)"
        return f"{k.upper()} spans {reach}, {_s(_f(wire[k]))} on the wire"
    spans = "; ".join(span(k) for k in groups)
    head = f"{N:g} GPUs over {int(np.ceil(N / island))} islands of {island:g} (core {over:g}:1)"
    if not crossing or crossing == ["dp"]:
        return Verdict(name, PASS, f"{head}; only DP crosses the oversubscribed tier, as it must",
                       (spans,) if spans else ())
    if any(k in crossing for k in ("tp", "cp", "ep")):
        bad = [k.upper() for k in crossing if k in ("tp", "cp", "ep")]
        why = ("an MoE all-to-all across islands turns the core's oversubscription into step time"
               if "EP" in bad else "latency-bound collectives on the oversubscribed core")
        return Verdict(name, FAIL, f"{head}; {', '.join(bad)} cross the oversubscribed tier: {why}", (spans,))
    return Verdict(name, WARN, f"{head}; PP crosses the oversubscribed tier (seed 001: same island preferred)",
                   (spans,))


def _dp_groups(cluster, plan):
    """topology.groups as evaluate lays them out: with hybrid sharding DP is a shard group of s / e DP'
    ranks and a ``dp_replica`` group of its r replicas (topology.dp_layout)."""
    d, d_rep, _ = derived(cluster, plan)
    group, replicas = topology.dp_layout(d_rep, plan, hybrid_shard(d, plan))
    return topology.groups(cluster, plan, group, replicas=replicas)


def _tier(g, cluster) -> str:
    """Where a group's collective runs: the torus links, else scale-up when it fits one domain."""
    if _f(cluster.topology) == 2:
        return "torus links"
    return "scale-up" if _f(topology.group_inside(g["stride"], g["size"], cluster.domain)) > 0.5 else "scale-out"


def _q3(r, cluster, plan, fid, busbw, dp_inside) -> Verdict:
    name = "DP hides behind backward"
    d = _f(r.dp)
    if _f(r.traffic_bytes.dp) == 0:
        return Verdict(name, PASS, "no data-parallel traffic (d = 1)")
    bw = _f(cluster.bw_up_bytes_per_s if dp_inside else cluster.bw_out_bytes_per_s)
    src = "--busbw" if busbw else ("scale-up" if dp_inside else "scale-out") + " bandwidth of the cluster"
    rate = f"at {bw / 1e9:g} GB/s ({src})"
    if _f(cluster.topology) == 2:   # a torus times each axis on its own links (dse.equations.topology)
        rate = "on the torus links"
    wire, compute, step = _f(r.wire_s.dp), _f(r.compute_s), _f(r.step_s)
    window = _f(schedule.hide_window(compute, fid.dp_overlap, plan.overlap_grad_reduce))  # as evaluate uses it
    exposed = _f(r.exposed_s.dp)
    h = hybrid_shard(d, plan)
    if h is not None and _f(h[1]) > 1:   # each group where its ranks sit (a torus: its axis links)
        grp = _dp_groups(cluster, plan)
        sync = (f"hybrid sharding: sharded over {_f(h[0]):g} ({_tier(grp['dp'], cluster)}), all-reduced across "
                f"{_f(h[1]):g} groups ({_tier(grp['dp_replica'], cluster)})")
    else:
        sync = f"gradient sync over d = {d:g}"
    nums = (f"DP moves {_gb(_f(r.traffic_bytes.dp))} a rank a step ({sync}); "
            f"{rate} that is {_s(wire)} against a backward window of {_s(window)} "
            f"({_f(fid.dp_overlap):.2f} of {_s(compute)} compute)")
    if exposed <= 0 and wire <= HEADROOM * window:
        return Verdict(name, PASS, f"{nums}: hidden, {100 * wire / window:.0f}% of the window")
    if exposed <= 0:
        return Verdict(name, WARN, f"{nums}: hidden, but {100 * wire / window:.0f}% of the window leaves little headroom")
    share = exposed / step
    status = FAIL if share > EXPOSED_FAIL_SHARE else WARN
    return Verdict(name, status, f"{nums}: {_s(exposed)} exposed, {100 * share:.1f}% of the step")


def _q4(r, plan) -> Verdict:
    name = "microbatches m >= 4p"
    p, v, m = _f(plan.pp), _f(plan.vpp), _f(r.microbatches)
    if p <= 1:
        return Verdict(name, PASS, "no pipeline (PP 1): no bubble")
    nums = (f"m = {m:g}, p = {p:g}{f', v = {v:g}' if v > 1 else ''}: bubble (p-1)/(v m) = "
            f"{100 * _f(r.bubble_fraction):.1f}% of compute, {100 * _f(r.bubble_share):.1f}% of the step")
    if m >= MICROBATCHES_PER_STAGE * p:
        return Verdict(name, PASS, nums)
    if m >= p:
        return Verdict(name, WARN, f"{nums}; m < {MICROBATCHES_PER_STAGE}p = {MICROBATCHES_PER_STAGE * p:g}: "
                                   f"raise the global batch, lower b or p, or interleave")
    return Verdict(name, FAIL, f"{nums}; m < p: the pipeline never fills")


def _memory(r, cluster) -> Verdict:
    name = "plan is feasible"
    mem, hbm = _f(r.memory_bytes), _f(cluster.hbm_bytes)
    reasons = [msg for k, (n, msg) in enumerate(REASONS) if int(np.asarray(r.reasons)) & (1 << k)]
    nums = f"{_gb(mem)} of {_gb(hbm)} a GPU"
    if reasons:
        return Verdict(name, FAIL, f"{nums}; " + "; ".join(reasons))
    return Verdict(name, PASS, f"{nums}, every divisibility rule holds")
