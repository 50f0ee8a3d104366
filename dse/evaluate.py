"""``evaluate``: the planner's model for one plan, a batch, or a broadcast grid.

One composition of the concept modules (memory, traffic, collectives, topology,
schedule, compute). The sweep calls it on broadcast axes, co-design through the step
primitives' ``sharpness``; nothing else holds an equation.
"""

from __future__ import annotations

import jax.numpy as jnp

from dse.equations import compute, cost, memory, schedule, steps, topology, traffic
from dse.inputs.fidelity import Fidelity, resolve
from dse.inputs import Cluster, ModelShape, Plan
from dse.report import REASON_BIT, WARNING_BIT, PerDim, Report

__all__ = ["evaluate", "derived"]


def _divides(n, k):
    """1 where k divides n exactly: floor(q) == q (cheaper than fmod on XLA:CPU)."""
    q = n / k
    return jnp.floor(q) == q


def derived(cluster: Cluster, plan: Plan):
    """d = N/(t c p), d' = d/e, m = B/(d b) (seed 000, notation)."""
    d = cluster.gpus / (plan.tp * plan.cp * plan.pp)
    m = plan.gbs / (d * plan.mbs)
    return d, d / plan.ep, m


def _bits(conds: dict, table: dict):
    out = jnp.zeros(jnp.broadcast_shapes(*[jnp.shape(c) for c in conds.values()]), jnp.int32)
    for name, cond in conds.items():
        out = out | jnp.where(cond, jnp.int32(table[name]), jnp.int32(0))
    return out


def evaluate(model: ModelShape, cluster: Cluster, plan: Plan, fidelity="seed", *,
             sharpness=None) -> Report:
    """Memory, traffic, placement, bubble, compute and step time of a training plan.

    ``fidelity``: "seed" (seed 000's simulator, exactly), "calibrated", or a Fidelity.
    ``sharpness``: None for the exact model; a number for the smooth relaxation.
    """
    fid: Fidelity = resolve(fidelity)
    k = sharpness
    t, c, e, p, v = plan.tp, plan.cp, plan.ep, plan.pp, plan.vpp
    b, B, zero, rc, sp = plan.mbs, plan.gbs, plan.zero, plan.recompute, plan.sp
    N = cluster.gpus
    d, d_rep, m = derived(cluster, plan)

    # ------------------------------------------------------------ parameters and memory
    total, active, _, _ = memory.param_counts(model, fid)
    dense_r, expert_r = memory.params_per_rank(model, fid, t, p, e)   # seed 000 sec.1
    sched, ga = plan.schedule, plan.grad_accum
    # Gradients stay unsharded while accumulated locally over microbatches (FSDP, seed 000 sec.1);
    # ZeRO-2 reduce-scatters every microbatch (memory.gradient_mode).
    grad_zero, ga = memory.gradient_mode(zero, ga, m, fid.zero3_microbatch)
    wd, _, od = memory.model_state_bytes(dense_r, d, zero)           # dense: ZeRO over d
    we, _, oe = memory.model_state_bytes(expert_r, d_rep, zero)      # experts: over d/e
    _, gd, _ = memory.model_state_bytes(dense_r, d, grad_zero)
    _, ge, _ = memory.model_state_bytes(expert_r, d_rep, grad_zero)
    copies = memory.dualpipe_weight_factor(sched)                     # DeepSeek-V3 Table 2
    weights, grads, optim = copies * (wd + we), copies * (gd + ge), od + oe
    # FlashAttention keeps no s^2 scores, like selective recompute (Dao et al. 2022, sec.3.1).
    rc_mem = jnp.where(plan.flash_attention >= 1, jnp.maximum(rc, 1.0), rc)
    acts = memory.activation_bytes(model, t, c, p, b, m, v, rc_mem, sp, k, sched)
    acts = acts + memory.embedding_activation_bytes(model, t, c, p, b, fid)
    acts = acts + plan.keep_stage_outputs * memory.stage_output_bytes(model, c, p, b, m, k)
    states = weights + grads + optim + acts
    other = fid.memory_overhead * states
    mem_total = states + other
    fits = mem_total <= cluster.hbm_bytes

    # ------------------------------------------------------------ traffic per dimension
    layers_stage = model.layers / p                                     # seed 000 sec.4: L/p
    moe_stage = memory.moe_layers(model, fid) / p
    topk = steps.where(fid.real_shapes, model.topk, fid.seed_topk)
    load = compute.moe_load_factor(plan.capacity_factor, fid)          # padding or imbalance (seed: 1)
    vols = {
        "tp": traffic.tp(model, t, c, b, layers_stage, m, rc, sp),
        "cp": traffic.cp(model, t, c, b, layers_stage, m, rc),
        "ep": traffic.ep(model, c, e, b, moe_stage, m, rc, topk * load),
        "pp": traffic.pp(model, t, c, p, b, m, v),
    }
    dp_dense = traffic.dp(dense_r, d, zero, layers_stage, m, fid.zero3_microbatch, ga)
    dp_expert = traffic.dp(expert_r, d_rep, zero, layers_stage, m, fid.zero3_microbatch, ga)

    # ------------------------------------------------------------ placement and wire time
    # topology.network: tiers, islands, rails, torus axes, hierarchical DP, node-limited EP;
    # calibrated mode runs each tier at its achieved bus bandwidth (seed: x1).
    net = topology.network(cluster, plan, dict(vols, dp=dp_dense, dp_expert=dp_expert), d_rep,
                           topk, model.route_node_limit, fid.latency, k,
                           up_efficiency=fid.bw_up_efficiency, out_efficiency=fid.bw_out_efficiency)
    inside, wire = net["inside"], net["wire"]
    first_gathers = jnp.where(zero >= 3, fid.zero3_microbatch * (1.0 + (m - 1.0)), 0.0)   # one per microbatch
    unprefetched = (schedule.unprefetched(wire["dp"], dp_dense["calls"], first_gathers)
                    + schedule.unprefetched(wire["dp_expert"], dp_expert["calls"], first_gathers))
    wire["dp"] = wire.pop("dp") + wire.pop("dp_expert")

    # ------------------------------------------------------------ compute and schedule
    # Model FLOPs: matmuls of the active weights (the input embedding is a lookup, the
    # logits are a V x h matmul), the attention core, the logits (Korthikanti eq.7).
    embed = memory.embedding_params(model, fid)
    attn_f = compute.attention_flops(model, B, fid)
    logit_f = compute.logits_flops(model, B, fid)
    layer_f = 6.0 * (active - embed) * B * model.seq                     # seed 000 sec.6: 6 Psi B s
    mflops = layer_f + attn_f + logit_f
    extra_gemm, extra_attn = compute.recompute_flops(layer_f, attn_f, rc, fid)
    _, _, expert_w, _, _ = memory.layer_params(model, fid)
    expert_f = 6.0 * memory.moe_layers(model, fid) * topk * expert_w * B * model.seq
    extra_gemm = extra_gemm + (load - 1.0) * expert_f * jnp.where(rc >= 2, compute.FULL_RECOMPUTE_FLOPS, 1.0)
    hflops = mflops + extra_gemm + extra_attn
    use_fp8 = (plan.fp8 >= 1) & (cluster.peak_fp8_flops_per_s > 0)
    peak_gemm = jnp.where(use_fp8, cluster.peak_fp8_flops_per_s, cluster.peak_flops_per_s)
    balance = steps.safe_div(peak_gemm, cluster.hbm_bw_bytes_per_s)     # roofline ridge, FLOP/byte
    gemm_eff = compute.layer_gemm_efficiency(model, t, c, e, b, balance, jnp.where(use_fp8, 1.0, 2.0),
                                             peak_gemm * fid.flops_efficiency, fid)
    compute_s, attn_s = compute.step_compute_time(layer_f + logit_f + extra_gemm, attn_f + extra_attn, logit_f,
                                                  p, N, cluster, plan.fp8, gemm_eff, fid)
    layer_bytes = memory.activation_bytes_per_layer(model, t, c, b, jnp.minimum(plan.flash_attention, 1.0), sp)
    compute_s = compute_s + compute.elementwise_time(layer_bytes, layers_stage, m, rc,
                                                     cluster.hbm_bw_bytes_per_s, fid)
    optimizer_s = (compute.optimizer_time(dense_r, d, zero, cluster.hbm_bw_bytes_per_s, fid)
                   + compute.optimizer_time(expert_r, d_rep, zero, cluster.hbm_bw_bytes_per_s, fid))
    bubble = schedule.bubble_fraction(p, m, v, sched)
    bubble_s = compute_s * bubble
    exposed = {
        "tp": schedule.exposed(wire["tp"], fid.tp_overlap + plan.tp_comm_overlap * fid.tp_comm_overlap),
        "cp": jnp.where(plan.cp_ring >= 1, schedule.exposed_dp(wire["cp"], attn_s, 1.0, k),
                        schedule.exposed(wire["cp"], fid.cp_overlap)),
        # DualPipe hides EP and PP behind the paired chunk's compute (DeepSeek-V3 sec.3.2.1);
        # Megatron-Core's a2a overlap hides EP; otherwise the fitted share (seed: exposed).
        "ep": schedule.exposed_behind(wire["ep"], compute_s, (sched >= 2) | (plan.ep_comm_overlap >= 1),
                                      schedule.exposed(wire["ep"], fid.ep_overlap), k),
        "pp": schedule.exposed_behind(wire["pp"], steps.relu(compute_s - wire["ep"], k), sched >= 2,
                                      schedule.exposed(wire["pp"], fid.pp_overlap), k),
        "dp": schedule.exposed_dp(wire["dp"], compute_s, fid.dp_overlap, k, plan.overlap_grad_reduce)
        + unprefetched,
    }
    # seed 000 sec.6: step = compute (1 + bubble) + t_TP + t_PP + t_EP + t_CP + max(0, t_DP - 2/3 compute)
    step_s = compute_s + bubble_s + exposed["tp"] + exposed["cp"] + exposed["ep"] + exposed["pp"] + exposed["dp"]
    step_s = step_s + optimizer_s                                       # 0 in seed mode

    # ------------------------------------------------------------ feasibility
    L = model.layers
    reasons = _bits({
        "gpus_not_divisible": ~_divides(N, t * c * p),
        "dp_not_divisible_by_ep": ~_divides(d, e),
        "batch_not_divisible": ~_divides(B, d * b),
        "heads_not_divisible_by_tp": ~_divides(model.heads, t),
        "experts_not_divisible_by_ep": ~_divides(model.experts, e) | ((e > 1) & (model.experts <= 1)),
        "layers_lt_stages": L < p * v,
        "layers_not_divisible_by_vpp": (v > 1) & ~_divides(L, p * v),
        "seq_not_divisible_by_cp": (c > 1) & ~_divides(model.seq, 2.0 * c),
        "out_of_memory": ~fits,
        "torus_mapping_invalid": net["torus_invalid"],
    }, REASON_BIT)
    warnings = _bits({
        "tp_crosses_domain": inside["tp"] < 0.5,
        "cp_crosses_domain": inside["cp"] < 0.5,
        "ep_crosses_domain": inside["ep"] < 0.5,
        "few_microbatches": (p > 1) & (m < 4.0 * p),
        "dp_exposed": exposed["dp"] > 0,
    }, WARNING_BIT)

    one = jnp.ones_like(t)
    return Report(
        dp=d, microbatches=m,
        params_total=total, params_active=active, params_per_rank=dense_r + expert_r,
        weights_bytes=weights, grads_bytes=grads, optimizer_bytes=optim,
        activations_bytes=acts, other_bytes=other, memory_bytes=mem_total,
        fits=fits.astype(mem_total.dtype),
        traffic_bytes=PerDim(**{n: vols[n]["bytes"] for n in vols},
                             dp=dp_dense["bytes"] + dp_expert["bytes"]),
        calls=PerDim(**{n: vols[n]["calls"] for n in vols},
                     dp=dp_dense["calls"] + jnp.where(expert_r > 0, dp_expert["calls"], 0.0)),
        message_bytes=PerDim(**{n: vols[n]["message"] for n in vols}, dp=dp_dense["message"]),
        group_size=PerDim(tp=t * one, cp=c * one, ep=e * one, pp=p * one, dp=d * one),
        inside_domain=PerDim(tp=inside["tp"], cp=inside["cp"], ep=inside["ep"], pp=inside["pp"],
                             dp=jnp.minimum(inside["dp"], jnp.where(expert_r > 0, inside["dp_expert"], 1.0))),
        wire_s=PerDim(**wire),
        exposed_s=PerDim(**exposed),
        bubble_fraction=bubble, bubble_s=bubble_s, bubble_share=bubble_s / step_s,
        model_flops=mflops, hardware_flops=hflops, compute_s=compute_s, step_s=step_s,
        tokens_per_s=B * model.seq / step_s,
        mfu=mflops / (N * cluster.peak_flops_per_s * step_s),
        feasible=(reasons == 0).astype(mem_total.dtype), reasons=reasons, warnings=warnings,
        **_network_fields(net, cluster, k),
        grads_sharded=(grad_zero >= 2).astype(mem_total.dtype) * one,
        grad_reduce_per_microbatch=ga * one,
    )


def _network_fields(net, cluster, sharpness=None):
    """Bytes per tier (dense + expert DP summed) and the network's cost and power (dse/equations/cost.py)."""
    per = lambda b: PerDim(tp=b["tp"], cp=b["cp"], ep=b["ep"], pp=b["pp"], dp=b["dp"] + b["dp_expert"])  # noqa: E731
    usd, watts = cost.network_cost(cluster, sharpness)
    return dict(scale_up_bytes=per(net["up_bytes"]), scale_out_bytes=per(net["out_bytes"]),
                network_cost_usd=usd, network_power_w=watts)
