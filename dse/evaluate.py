"""``evaluate``: the planner's model for one plan, a batch, or a broadcast grid.

One composition of the equation modules (memory, traffic, collectives, topology,
schedule, compute, feasibility, cost), in the order a step happens: what a rank holds,
what each dimension sends, where it travels and how long, how long the math takes and
what of the communication hides behind it. The sweep calls it on broadcast axes,
co-design through the step primitives' ``sharpness``; nothing else holds an equation.
"""

from __future__ import annotations

from dse.backend import host_when_concrete, jnp
from dse.equations import compute, cost, feasibility, memory, offload, schedule, steps, topology, traffic
from dse.equations.degrees import derived, expert_split, hybrid_shard, weight_replicas
from dse.inputs import Cluster, ModelShape, Plan
from dse.inputs.fidelity import Fidelity, resolve
from dse.report import BUFFER_PARTS, WARNING_BIT, PerDim, Report

__all__ = ["evaluate", "derived", "NETWORK_COST_FIGURES"]

# The Report figures of the network's price model: NaN unless ``evaluate(network_cost=True)``.
NETWORK_COST_FIGURES = ("network_cost_usd", "network_power_w")


def _bits(conds: dict, table: dict):
    out = jnp.zeros(jnp.broadcast_shapes(*[jnp.shape(c) for c in conds.values()]), jnp.int32)
    for name, cond in conds.items():
        out = out | jnp.where(cond, jnp.int32(table[name]), jnp.int32(0))
    return out


@host_when_concrete
def evaluate(model: ModelShape, cluster: Cluster, plan: Plan, fidelity: Fidelity | str = "seed", *,
             sharpness=None, network_cost: bool = True) -> Report:
    """Memory, traffic, placement, bubble, compute and step time of a training plan.

    ``fidelity``: a Fidelity (``dse.inputs.fidelity.for_cluster`` gives the default for a
    cluster preset), or a mode name ("seed": seed 000's simulator exactly; "calibrated").
    ``sharpness``: None for the exact model; a number for the smooth relaxation.
    ``network_cost``: False leaves NETWORK_COST_FIGURES (cost and power) NaN, not computed:
    for a caller that reads neither (a sweep kernel whose objectives do not name them, a fit of
    step times, co-design). The network's price model depends on the cluster alone, and in such a
    program it was a tenth of the trace (a sweep kernel with bandwidth axes), which XLA then dropped unread.
    """
    fid: Fidelity = resolve(fidelity)
    d, d_rep, m = derived(cluster, plan)
    hybrid = hybrid_shard(d, plan)                                       # HSDP: (s, r), None when off
    shard, shard_e = weight_replicas(d, d_rep, plan.cp, fid.grad_over_cp, None if hybrid is None else hybrid[0],
                                     plan.etp)
    mem = _memory(model, cluster, plan, fid, shard, shard_e, m, sharpness, None if hybrid is None else hybrid[1])
    fits = mem["total"] <= cluster.hbm_bytes
    net, vols, dp_parts = _network(model, cluster, plan, fid, d_rep, (shard, shard_e), m, mem, sharpness, hybrid)
    work = _compute(model, cluster, plan, fid, shard, shard_e, m, mem, sharpness)
    exposed, step_s = _step(plan, fid, net, dp_parts, work, m, sharpness, vols["cp"])
    off = _offload(cluster, plan, fid, m, mem, work, sharpness)
    step_s = step_s + off["exposed_s"]

    node_host = mem["host"] * offload.ranks_per_node(cluster)
    q = feasibility.quantities(model, cluster, plan, d, m, mem["total"], net["torus_invalid"],
                               host=node_host, host_capacity=cluster.node_host_bytes)
    inside = net["inside"]
    warnings = _bits({
        "tp_crosses_domain": inside["tp"] < 0.5,
        "cp_crosses_domain": inside["cp"] < 0.5,
        "ep_crosses_domain": inside["ep"] < 0.5,
        "few_microbatches": (plan.pp > 1) & (m < 4.0 * plan.pp),
        "dp_exposed": exposed["dp"] > 0,
    }, WARNING_BIT)
    reasons = feasibility.reason_bits(q)

    one = jnp.ones_like(plan.tp)
    dp_dense, dp_expert = dp_parts
    expert_r = mem["expert_r"]
    N = cluster.gpus
    return Report(
        dp=d, microbatches=m,
        params_total=mem["params_total"], params_active=mem["params_active"],
        params_per_rank=mem["dense_r"] + expert_r,
        weights_bytes=mem["weights"], grads_bytes=mem["grads"], optimizer_bytes=mem["optim"],
        activations_bytes=mem["acts"], other_bytes=mem["other"], memory_bytes=mem["total"],
        fits=fits.astype(mem["total"].dtype),
        traffic_bytes=PerDim(**{n: vols[n]["bytes"] for n in vols}, dp=dp_dense["bytes"] + dp_expert["bytes"]),
        calls=PerDim(**{n: vols[n]["calls"] for n in vols},
                     dp=dp_dense["calls"] + jnp.where(expert_r > 0, dp_expert["calls"], 0.0)),
        message_bytes=PerDim(**{n: vols[n]["message"] for n in vols}, dp=dp_dense["message"]),
        group_size=PerDim(tp=plan.tp * one, cp=plan.cp * one, ep=plan.ep * one, pp=plan.pp * one, dp=d * one),
        inside_domain=PerDim(tp=inside["tp"], cp=inside["cp"], ep=inside["ep"], pp=inside["pp"],
                             dp=jnp.minimum(inside["dp"], jnp.where(expert_r > 0, inside["dp_expert"], 1.0))),
        wire_s=PerDim(**_wire_per_dim(net["wire"])),
        exposed_s=PerDim(**exposed),
        bubble_fraction=work["bubble"], bubble_s=work["bubble_s"], bubble_share=work["bubble_s"] / step_s,
        model_flops=work["model_flops"], hardware_flops=work["hardware_flops"], compute_s=work["compute_s"],
        step_s=step_s,
        tokens_per_s=plan.gbs * model.seq / step_s,
        mfu=work["model_flops"] / (N * cluster.peak_flops_per_s * step_s),
        feasible=(reasons == 0).astype(mem["total"].dtype), reasons=reasons, warnings=warnings,
        **_network_fields(net, cluster, sharpness, network_cost),
        grads_sharded=(mem["grad_zero"] >= 2).astype(mem["total"].dtype) * one,
        grad_reduce_per_microbatch=mem["grad_accum"] * one,
        **{f"{part}_bytes": mem[part] for part in BUFFER_PARTS},
        host_bytes=mem["host"], node_host_bytes=node_host, offload_s=off["exposed_s"],
        host_optimizer_s=off["optimizer_host_s"],
    )


def pipeline_split(model, plan):
    """(first, middle, last) stage layers and whether the split is uneven (schedule.stage_layers)."""
    return schedule.stage_layers(model.layers, plan.pp, plan.first_stage_layers, plan.last_stage_layers,
                                 plan.embedding_in_split, plan.loss_in_split)


def _concretely_even(plan) -> bool:
    """The plan's pipeline split is the even L/p wherever it is evaluated (schedule.concretely_even)."""
    return schedule.concretely_even(plan.first_stage_layers, plan.last_stage_layers, plan.embedding_in_split,
                                    plan.loss_in_split)


def _full_share(model, plan, k):
    """Share of the fullest (first, even) stage's layers that full recompute checkpoints
    (memory.full_recompute_share; plan.recompute_every): what compute and traffic repeat."""
    return memory.full_recompute_share(steps.ceil(model.layers / plan.pp, k), plan.recompute_every, k)


def _memory(model, cluster, plan, fid, shard, shard_e, m, k, replicas=None) -> dict:
    """Parameters and bytes on the fullest rank: model states under ZeRO, activations, the buffers
    beside them (memory.py: logits, SP/ZeRO/DP buffers, NCCL, CUDA context, fragmentation), and what
    offload moves to the host (offload.py).

    Even splits: the first stage (seed 000 sec.2), or the last where the output layer and its
    logits make it fuller. Uneven splits (schedule.stage_layers): also the second stage (the
    middle stages' layers, min(p - 1, m) microbatches). An FP8 recipe keeps FP8 weight copies
    and (delayed) amax state beside the weights and stores GEMM inputs in FP8 (memory.fp8_*);
    FP8 parameters hold the layer weights in 1 byte, the embedding and output layer stay 16-bit.
    """
    t, c, e, p, v = plan.tp, plan.cp, plan.ep, plan.pp, plan.vpp
    t_e = expert_split(plan)[1]                                       # the TP degree the experts split over
    b, zero, rc, sp, sched = plan.mbs, plan.zero, plan.recompute, plan.sp, plan.schedule
    total, active, _, _ = memory.param_counts(model, fid)
    f, mid, last, uneven = pipeline_split(model, plan)
    # Gradients stay unsharded while accumulated locally over microbatches (FSDP, seed 000 sec.1);
    # ZeRO-2 reduce-scatters every microbatch (memory.gradient_mode).
    grad_zero, ga = memory.gradient_mode(zero, plan.grad_accum, m, fid.zero3_microbatch)
    copies = memory.dualpipe_weight_factor(sched)                     # DeepSeek-V3 Table 2
    # FlashAttention keeps no s^2 scores, only its logsumexp (Dao et al. 2022, sec.3.1): memory.layer_tensor_bytes
    fa, group, every = plan.flash_attention, plan.recompute_layers, plan.recompute_every
    even_layers = steps.ceil(model.layers / p, k)
    recipe = compute.fp8_recipe(plan.fp8, cluster)
    w_bytes = memory.compute_weight_bytes(recipe, plan.fp8_param_gather * plan.fp8_cache)   # stored in FP8
    modules = plan.recompute_modules                                  # selective recompute's (memory.MODULE_DROPS)
    even_share = memory.full_recompute_share(even_layers, every, k)
    per_layer = memory.activation_bytes_per_layer(model, t, c, b, rc, sp, fid, fa, group, even_share, modules)
    # one communicator per parallel group of more than one rank (NCCL buffers: memory.nccl_bytes)
    groups = sum(jnp.where(x > 1, 1.0, 0.0)
                 for x in (t, c, e, p, shard) + (() if replicas is None else (replicas,)))   # HSDP: its replica group too
    # one embedding matrix on a rank (vocab-parallel over t): the largest ZeRO-3 unit on its stage
    embed_unit = memory.embedding_params(model, fid) / (2.0 - jnp.clip(model.tied_embeddings, 0.0, 1.0)) / t

    def held(share, embed_on, layers):
        """What a stage holds wherever it sits in the pipeline: its parameters on a rank, their
        states and the buffers they set (an even split's first and last stages share it)."""
        dense_r, expert_r = memory.params_per_rank(model, fid, t, p, e, share, embed_on, t_e)   # seed 000 sec.1
        layer_r, _ = memory.params_per_rank(model, fid, t, p, e, share, 0.0, t_e)   # without the embedding
        embed_part = dense_r - layer_r
        _, _, od = memory.model_state_bytes(dense_r, shard, zero)             # dense: ZeRO over d (x c)
        wd = (memory.model_state_bytes(layer_r, shard, zero, w_bytes)[0]      # layer weights (FP8 with param gather)
              + memory.model_state_bytes(embed_part, shard, zero)[0])         # embedding, output layer: 16-bit
        we, _, oe = memory.model_state_bytes(expert_r, shard_e, zero, w_bytes)   # experts: over d/e (x c)
        _, gd, _ = memory.model_state_bytes(dense_r, shard, grad_zero, grad_bytes=plan.grad_bytes)
        _, ge, _ = memory.model_state_bytes(expert_r, shard_e, grad_zero, grad_bytes=plan.grad_bytes)
        fp8_state = (memory.fp8_weight_copy_bytes(layer_r, shard, zero, recipe, plan.fp8_param_gather, fid, plan.fp8_cache)
                     + memory.fp8_weight_copy_bytes(expert_r, shard_e, zero, recipe, plan.fp8_param_gather, fid, plan.fp8_cache)
                     + memory.fp8_amax_bytes(model, layers, layers * memory.moe_layers(model, fid) / model.layers,
                                             e, recipe, plan.fp8_amax_history, fid))
        owned = offload.owned_params(dense_r, shard, zero) + offload.owned_params(expert_r, shard_e, zero)
        embed_r = embed_on * jnp.where(p > 1, 0.5, 1.0) * memory.embedding_params(model, fid) / t
        layer_unit = (dense_r - embed_r + expert_r) / jnp.maximum(layers, 1.0)
        unit = jnp.maximum(layer_unit, embed_on * embed_unit)
        return dict(dense_r=dense_r, expert_r=expert_r, layer_r=layer_r, owned=owned, fp8_state=fp8_state,
                    weights=copies * (wd + we + fp8_state), grads=copies * (gd + ge), optim=od + oe,
                    tp_buffer=memory.sp_gather_bytes(model, t, c, b, sp, fid),
                    dp_buffer=memory.zero3_gather_bytes(unit, zero, w_bytes, fid, plan.zero3_live_params)
                    + memory.dp_bucket_bytes(dense_r + expert_r, zero, plan.dp_bucket_params, plan.dp_bucket_copy, fid),
                    nccl=memory.nccl_bytes(groups, fid), context=memory.context_bytes(fid))

    def stage(share, embed_on, layers, index, h=None, layer_bytes=None, dense_bytes=None):
        """A stage's memory: ``h`` what it holds (``held``), the activations of its place (``index``)
        and the buffers they set; ``layer_bytes`` (``dense_bytes``): one (dense) layer's activations when
        the caller has them."""
        h = held(share, embed_on, layers) if h is None else h
        first_stage = jnp.where(index <= 0, 1.0, 0.0)
        out_stage = memory.output_layer_stage(p, index)
        acts = memory.activation_bytes(model, t, c, p, b, m, v, rc, sp, k, sched, layers, index, fid, recipe,
                                       plan.fp8_cache, fa, group, every, layer_bytes, modules, dense_bytes)
        acts = acts + first_stage * memory.embedding_activation_bytes(model, t, c, p, b, fid)
        acts = acts + out_stage * memory.output_layer_input_bytes(model, t, c, b, fid)
        acts = acts + (1.0 - jnp.where(p > 1, out_stage, 0.0)) * plan.keep_stage_outputs * memory.stage_output_bytes(
            model, c, p, b, m, k)
        acts = acts + memory.cp_buffer_bytes(model, t, c, b, plan.cp_ring, fid)
        weights, grads, optim = h["weights"], h["grads"], h["optim"]
        host = offload.host_bytes(weights, grads, optim, acts, h["owned"], plan)
        grads_all = grads
        weights, grads, optim = offload.device_states(weights, grads, optim, plan)
        acts = offload.device_activations(acts, per_layer, plan)
        parts = dict(dense_r=h["dense_r"], expert_r=h["expert_r"], layer_r=h["layer_r"], owned=h["owned"],
                     grads_all=grads_all, weights=weights, grads=grads, optim=optim, acts=acts, host=host,
                     fp8_state=copies * h["fp8_state"],
                     logits=out_stage * memory.logits_bytes(model, t, c, b, fid, plan.loss_logit_bytes),
                     tp_buffer=h["tp_buffer"], dp_buffer=h["dp_buffer"], nccl=h["nccl"], context=h["context"])
        transient = sum(parts[n] for n in ("acts", "logits", "tp_buffer", "dp_buffer"))   # freed within a step
        parts["fragmentation"] = memory.fragmentation_bytes(transient, fid) * plan.caching_allocator
        parts["other"] = sum(parts[n] for n in BUFFER_PARTS)
        parts["total"] = parts["weights"] + parts["grads"] + parts["optim"] + acts + parts["other"]
        return parts

    even = _concretely_even(plan)   # every stage's share of the layers is 1
    if even and memory.every_layer_alike(every):
        # an even split's first and last stages hold the same parameters and states, and every
        # layer keeps what ``per_layer`` counts: worked out once for both
        h = held(1.0, 1.0, even_layers)
        dense_layer = memory.dense_layer_bytes(model, t, c, b, rc, sp, fid, fa, group, even_share, modules)
        first = second = stage(1.0, 1.0, even_layers, 0.0, h, per_layer, dense_layer)
        final = stage(1.0, 1.0, even_layers, p - 1.0, h, per_layer, dense_layer)
    else:
        share = lambda n: 1.0 if even else jnp.where(uneven > 0, n * p / model.layers, 1.0)   # noqa: E731
        first = stage(share(f), 1.0, jnp.where(uneven > 0, f, even_layers), 0.0)
        # the middle stages (picked only where the split is uneven); an even split's are the first's
        second = first if even else stage(share(mid), 0.0, mid, 1.0)
        final = stage(share(last), 1.0, jnp.where(uneven > 0, last, even_layers), p - 1.0)
    pick = (uneven > 0) & (p > 2) & (second["total"] > first["total"])
    out = {name: jnp.where(pick, second[name], first[name]) for name in first}
    # the stage whose layers set traffic and the GPU optimizer step stays the first (or second): the
    # last stage is picked for its memory only
    rank_params = {"dense_r": out["dense_r"], "expert_r": out["expert_r"], "layer_r": out["layer_r"]}
    pick = (p > 1) & (final["total"] > out["total"])
    out = {name: jnp.where(pick, final[name], out[name]) for name in out}
    out.update(rank_params)
    return dict(out, params_total=total, params_active=active, grad_zero=grad_zero, grad_accum=ga, fp8_recipe=recipe,
                per_layer=per_layer, stage_layers=jnp.where(uneven > 0, jnp.maximum(jnp.maximum(f, mid), last),
                                                            even_layers))


def _offload(cluster, plan, fid, m, mem, work, k) -> dict:
    """Host link and host-side Adam time of the plan's offload choices (offload.times)."""
    gathers = 2.0 * jnp.where(fid.zero3_microbatch >= 1, m, 1.0)          # forward + backward gather, per microbatch (FSDP)
    weight_part = mem["owned"]                                           # ZeRO-3: the rank's partition
    return offload.times(mem["owned"], mem["grads_all"], weight_part, mem["per_layer"], mem["stage_layers"], m,
                         gathers, work["compute_s"],
                         memory.compute_weight_bytes(mem["fp8_recipe"], plan.fp8_param_gather), plan, cluster, k)


def _network(model, cluster, plan, fid, d_rep, shards, m, mem, k, hybrid=None):
    """Traffic per dimension (seed 000 sec.4) laid onto the network (topology.network). ``hybrid``
    (s, r): hybrid sharding's shard group and replicas (degrees.hybrid_shard); DP's traffic then
    includes the all-reduce of each shard across its replicas (traffic.replica)."""
    t, c, e, p, v, b, rc, sp = plan.tp, plan.cp, plan.ep, plan.pp, plan.vpp, plan.mbs, plan.recompute, plan.sp
    t_e = expert_split(plan)[1]                                         # folded EP: whole experts
    layers_stage = model.layers / p                                     # seed 000 sec.4: L/p
    # Uneven split: the stage with the most layers sends the most (schedule.stage_layers).
    f, mid, last, uneven = pipeline_split(model, plan)
    most = jnp.maximum(jnp.maximum(f, jnp.where(p > 2, mid, f)), last)
    stage_share = jnp.where(uneven > 0, most / layers_stage, 1.0)
    layers_stage = layers_stage * stage_share
    moe_stage = memory.moe_layers(model, fid) / p * stage_share
    topk = steps.where(fid.real_shapes, model.topk, fid.seed_topk)
    load = compute.moe_load_factor(plan.capacity_factor, fid)          # padding or imbalance (seed: 1)
    gather_bytes = traffic.fp8_gather_bytes(mem["fp8_recipe"], plan.fp8_tp_comm, fid)   # FP8 SP all-gathers
    share = _full_share(model, plan, k)                                 # layer-level checkpointing
    folded = jnp.where(t_e < t, 1.0, 0.0)                               # folded EP: no TP collectives around whole experts
    modules = plan.recompute_modules                                    # selective recompute's
    rerun_blocks, rerun_moe = memory.module_rerun_blocks(model, rc, modules, fid, folded)
    vols = {
        "tp": traffic.tp(model, t, c, b, layers_stage, m, rc, sp, gather_bytes, share, moe_stage * folded,
                         rerun_blocks / p * stage_share),
        "cp": traffic.cp(model, t, c, b, layers_stage, m, rc, plan.cp_ring, fid.cp_backward_gather,
                         compute.attention_recomputes(rc, fid, share, modules), share),
        "ep": traffic.ep(model, c, e, b, moe_stage, m, rc, topk * load, share, plan.ep_fp8_dispatch, t_e / t,
                         rerun_moe),
        "pp": traffic.pp(model, t, c, p, b, m, v),
    }
    ga = mem["grad_accum"]                                              # memory.gradient_mode
    # FP8 parameter all-gather (--fp8-param-gather): the layer weights at 1 byte (+ scales), the embedding at 2
    w_bytes = memory.compute_weight_bytes(mem["fp8_recipe"], plan.fp8_param_gather)
    dense_w_bytes = steps.safe_div(w_bytes * mem["layer_r"] + memory.WEIGHT_BYTES * (mem["dense_r"] - mem["layer_r"]),
                                   mem["dense_r"])
    # Gradients reduce over every rank holding the weights: DP x CP (degrees.weight_replicas).
    calls = traffic.zero3_collectives(plan)          # a layer's ZeRO-3 gather and reduce-scatter (stack data)
    reduce_w = traffic.grad_reduce_width(plan.grad_bytes, plan.grad_reduce_bytes)
    dp_dense = traffic.dp(mem["dense_r"], shards[0], plan.zero, layers_stage, m, fid.zero3_microbatch, ga, dense_w_bytes,
                          *calls, plan.zero3_rank_copies, reduce_w)
    dp_expert = traffic.dp(mem["expert_r"], shards[1], plan.zero, layers_stage, m, fid.zero3_microbatch, ga, w_bytes,
                           *calls, plan.zero3_rank_copies, reduce_w)
    # one layer's weights on the rank: the unit a ZeRO-3 gather fetches (schedule.unprefetched_gather)
    unit = steps.safe_div(mem["layer_r"] + mem["expert_r"], mem["stage_layers"])
    dp_dense, dp_expert = dict(dp_dense, unit=unit), dict(dp_expert, unit=unit)
    # topology.network: tiers, islands, rails, torus axes, hierarchical DP, node-limited EP;
    # calibrated mode runs each tier at its achieved bus bandwidth (seed: x1).
    laid = dict(vols, dp=dp_dense, dp_expert=dp_expert)
    group, replicas = topology.dp_layout(d_rep, plan, hybrid)           # HSDP: a shard group's DP' ranks
    if hybrid is not None:
        laid["dp_replica"] = traffic.replica(mem["dense_r"], shards[0], replicas, plan.zero, layers_stage, m, ga,
                                             reduce_w, mem["expert_r"], shards[1])
    net = topology.network(cluster, plan, laid, group,
                           topk, model.route_node_limit, fid.latency, k,
                           up_efficiency=fid.bw_up_efficiency, out_efficiency=fid.bw_out_efficiency,
                           a2a_efficiency=(fid.a2a_up_efficiency, fid.a2a_out_efficiency),
                           route_groups=model.route_groups, copy_s=fid.rank_copy_us * 1e-6, replicas=replicas,
                           a2a_local_peers=fid.a2a_local_peers)
    if hybrid is not None:   # the replica all-reduce counts as DP traffic (its wire time already does)
        rep = laid["dp_replica"]
        dp_dense = dict(dp_dense, bytes=dp_dense["bytes"] + rep["bytes"], calls=dp_dense["calls"] + rep["calls"])
    return net, vols, (dp_dense, dp_expert)


def _compute(model, cluster, plan, fid, shard, shard_e, m, mem, k) -> dict:
    """Model and hardware FLOPs, compute time of the slowest stage, optimizer step, bubble."""
    t, c, e, p, b, B, rc = plan.tp, plan.cp, plan.ep, plan.pp, plan.mbs, plan.gbs, plan.recompute
    N = cluster.gpus
    embed = memory.embedding_params(model, fid)
    layer_f, attn_f, logit_f = compute.step_flops(mem["params_active"], embed, model, B, fid)
    mflops = layer_f + attn_f + logit_f
    share = _full_share(model, plan, k)                                 # layer-level checkpointing
    extra_gemm, extra_attn = compute.recompute_flops(layer_f, attn_f, rc, fid, model, share, plan.recompute_modules)
    _, _, expert_w, _, _ = memory.layer_params(model, fid)
    topk = steps.where(fid.real_shapes, model.topk, fid.seed_topk)
    expert_f = compute.routed_expert_flops(memory.moe_layers(model, fid), topk, expert_w, model, B)
    extra_gemm = extra_gemm + compute.moe_padding_flops(expert_f, compute.moe_load_factor(plan.capacity_factor, fid), rc,
                                                         share)
    recipe = mem["fp8_recipe"]
    use_fp8 = recipe >= 1
    no_fp8 = steps.never(use_fp8)   # concretely 16-bit: the FP8 rate and casts are not traced
    peak_gemm = cluster.peak_flops_per_s if no_fp8 else jnp.where(use_fp8, cluster.peak_fp8_flops_per_s,
                                                                  cluster.peak_flops_per_s)
    balance = steps.safe_div(peak_gemm, cluster.hbm_bw_bytes_per_s)     # roofline ridge, FLOP/byte
    rates = compute.gemm_rates(cluster, plan.fp8, fid)                  # (the layer GEMMs' top rate, the 16-bit one)
    gemm_eff = compute.layer_gemm_efficiency(model, t, c, e, b, balance, jnp.where(use_fp8, 1.0, 2.0),
                                             rates[0] * fid.flops_efficiency, fid, expert_split(plan)[1])
    # CP: the attention core runs in calls of the rank's share (ring: c steps of it), slower
    # per FLOP at small calls (compute.attention_call_flops).
    attn_calls = (compute.attention_call_flops(model, t, c, b, plan.cp_ring, fid),
                  compute.attention_call_flops(model, t, 1.0, b, 0.0, fid))
    compute_s, attn_s = compute.step_compute_time(layer_f + logit_f + extra_gemm, attn_f + extra_attn, logit_f,
                                                  p, N, cluster, plan.fp8, gemm_eff, fid, plan.flash_attention, attn_calls,
                                                  compute.flash_attn_scale(cluster, plan.attn_kernel_fa2, fid), rates)
    attn_fwd_s = attn_s * compute.FWD_SHARE * steps.safe_div(attn_f, attn_f + extra_attn)   # model forward share
    layer_bytes = memory.activation_bytes_per_layer(model, t, c, b, jnp.minimum(plan.flash_attention, 1.0), plan.sp)
    # selective recompute's modules write the norms' and the activation's outputs again
    layer_bytes = layer_bytes + memory.rerun_elementwise_bytes(model, t, c, b, plan.sp, rc, plan.recompute_modules,
                                                               fid, plan.flash_attention)
    compute_s = compute_s + compute.elementwise_time(layer_bytes, model.layers / p, m, rc,
                                                     cluster.hbm_bw_bytes_per_s, fid, share)
    # the loss's softmax passes over the logits, on the output-layer stage
    loss_s = compute.loss_time(memory.logits_bytes(model, t, c, b, fid, plan.loss_logit_bytes), m,
                               cluster.hbm_bw_bytes_per_s, fid)
    compute_s = compute_s + loss_s
    # FP8 quantization passes (casts, transposes, amax) over the stage's GEMM inputs and weights
    if not no_fp8:
        cast_x, cast_dy = compute.fp8_cast_elements(model, t, c, b, plan.sp, model.layers / p,
                                                    memory.moe_layers(model, fid) / p, fid)
        compute_s = compute_s + compute.fp8_cast_time(cast_x, cast_dy, m, rc, mem["layer_r"] + mem["expert_r"],
                                                      recipe, plan.fp8_param_gather, cluster.hbm_bw_bytes_per_s, fid,
                                                      plan.fp8_cache, share)
    # Uneven split: the slowest stage sets the pace (and the bubble); the output layer runs on
    # the last stage (p x logits / N at the GEMM rate), the rest scales with a stage's layers.
    if not _concretely_even(plan):
        f, mid, last, uneven = pipeline_split(model, plan)
        logits_stage_s, _ = compute.step_compute_time(logit_f, 0.0, logit_f, p, N, cluster, plan.fp8, gemm_eff, fid,
                                                      rates=rates)
        logits_stage_s = logits_stage_s + loss_s
        slowest = schedule.slowest_stage_time(model.layers, p, f, mid, last, compute_s - logits_stage_s, logits_stage_s)
        compute_s = jnp.where(uneven > 0, slowest, compute_s)
    optimizer_s = (compute.optimizer_time(mem["dense_r"], shard, plan.zero, cluster.hbm_bw_bytes_per_s, fid)
                   + compute.optimizer_time(mem["expert_r"], shard_e, plan.zero, cluster.hbm_bw_bytes_per_s, fid))
    optimizer_s = optimizer_s * (1.0 - plan.offload_optimizer)         # the offloaded share steps on the host (offload.py)
    bubble = schedule.bubble_fraction(p, m, plan.vpp, plan.schedule)
    return dict(model_flops=mflops, hardware_flops=mflops + extra_gemm + extra_attn, compute_s=compute_s,
                attn_s=attn_s, attn_fwd_s=attn_fwd_s, optimizer_s=optimizer_s, bubble=bubble, bubble_s=compute_s * bubble)


def _wire_per_dim(wire: dict) -> dict:
    """Wire seconds per dimension, the dense and expert DP groups' summed as DP's."""
    return {**{n: w for n, w in wire.items() if n not in ("dp", "dp_expert")}, "dp": wire["dp"] + wire["dp_expert"]}


def _step(plan, fid, net, dp_parts, work, m, k, cpv):
    """Exposed communication per dimension and the step time (seed 000 sec.6)."""
    wire = net["wire"]
    dp_dense, dp_expert = dp_parts
    # the first unit's gather of each microbatch, in its collectives (traffic.zero3_collectives)
    first_gathers = (jnp.where(plan.zero >= 3, fid.zero3_microbatch * (1.0 + (m - 1.0)), 0.0)
                     * traffic.zero3_collectives(plan)[0])
    unprefetched = (schedule.unprefetched(wire["dp"], dp_dense["calls"], first_gathers)
                    + schedule.unprefetched(wire["dp_expert"], dp_expert["calls"], first_gathers))
    # ZeRO-3 gathers beyond the stack's prefetch buffer wait on the compute stream (DeepSpeed; FSDP: none)
    waited, hideable, early = zip(*(schedule.unprefetched_gather(wire[n], steps.safe_div(part["gather_bytes"], part["bytes"]),
                                                                 part["unit"], plan.zero3_prefetch_params)
                                    for n, part in (("dp", dp_dense), ("dp_expert", dp_expert))))
    compute_s = work["compute_s"]
    # what of the hideable DP traffic stays exposed
    dp_left = schedule.exposed_dp(sum(hideable), compute_s, fid.dp_overlap, k, plan.overlap_grad_reduce)
    zero3 = plan.zero >= 3
    if not steps.never(fid.zero3_forward_window * zero3):
        # ZeRO-3's forward gathers (half its gathers, those the prefetch buffer lets start early) hide
        # behind the forward pass, model FLOPs' forward share of the compute (recompute runs in backward)
        wire_fwd = 0.5 * sum(early)
        compute_fwd = compute_s * compute.FWD_SHARE * steps.safe_div(work["model_flops"], work["hardware_flops"])
        split = schedule.exposed_zero3(wire_fwd, sum(hideable), compute_fwd, compute_s, fid.dp_overlap, k,
                                       plan.overlap_grad_reduce)
        dp_left = jnp.where((fid.zero3_forward_window > 0) & zero3, split, dp_left)
    exposed = {
        "tp": schedule.exposed(wire["tp"], fid.tp_overlap + plan.tp_comm_overlap * fid.tp_comm_overlap),
        # Ring attention hides each hop behind a block's compute; the K/V all-gather sits
        # between the K/V projection and the attention that needs it (TE: "exposed").
        "cp": jnp.where(plan.cp_ring >= 1,
                        schedule.ring_attention_exposed(wire["cp"], cpv["steps"], cpv["fwd"], cpv["bwd"], cpv["home"],
                                                        plan.cp, work["attn_fwd_s"], cpv["blocks"], k),
                        schedule.exposed(wire["cp"], fid.cp_overlap)),
        # DualPipe hides EP and PP behind the paired chunk's compute (DeepSeek-V3 sec.3.2.1);
        # Megatron-Core's a2a overlap hides EP; otherwise the fitted share (seed: exposed).
        "ep": schedule.exposed_behind(wire["ep"], compute_s, (plan.schedule >= 2) | (plan.ep_comm_overlap >= 1),
                                      schedule.exposed(wire["ep"], fid.ep_overlap), k),
        "pp": schedule.exposed_behind(wire["pp"], steps.relu(compute_s - wire["ep"], k), plan.schedule >= 2,
                                      schedule.exposed(wire["pp"], fid.pp_overlap), k),
        "dp": dp_left + sum(waited) + unprefetched,
    }
    # seed 000 sec.6: step = compute (1 + bubble) + t_TP + t_PP + t_EP + t_CP + max(0, t_DP - 2/3 compute)
    step_s = compute_s + work["bubble_s"] + exposed["tp"] + exposed["cp"] + exposed["ep"] + exposed["pp"] + exposed["dp"]
    return exposed, step_s + work["optimizer_s"]                        # optimizer: 0 in seed mode


def _network_fields(net, cluster, sharpness=None, priced=True):
    """Bytes per tier (dense + expert DP summed) and the network's cost and power (dse/equations/cost.py;
    relaxed at ``cost.relaxed_sharpness``; NaN unless ``priced``)."""
    per = lambda b: PerDim(tp=b["tp"], cp=b["cp"], ep=b["ep"], pp=b["pp"], dp=b["dp"] + b["dp_expert"])  # noqa: E731
    if priced:
        figures = cost.network_cost(cluster, cost.relaxed_sharpness(sharpness))
    else:
        figures = (jnp.full((), jnp.nan, jnp.result_type(cluster.bw_out_bytes_per_s)),) * 2
    return dict(scale_up_bytes=per(net["up_bytes"]), scale_out_bytes=per(net["out_bytes"]),
                **dict(zip(NETWORK_COST_FIGURES, figures)))
