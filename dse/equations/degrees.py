"""The degrees a plan implies: d = N/(t c p), d' = d/e, m = B/(d b) (seed 000, notation).

Written once; ``evaluate``, the placement equations, the operator tools and the CLI call it.
"""

from __future__ import annotations

import numpy as np

from dse.backend import host_when_concrete, jnp
from dse.equations import steps

__all__ = ["derived", "weight_replicas", "hybrid_shard", "expert_split", "rank_dims", "folds_experts"]


def expert_split(plan):
    """(e_dp, t_e): the share of the EP degree carved from the DP ranks, and the TP degree the experts
    split over. Seed 000 and Megatron's default (Plan.etp = 0, ETP = TP): EP groups sit inside DP,
    e_dp = e, and each expert splits over the attention's t ranks. MoE parallel folding (Plan.etp = 1,
    Megatron-Core --expert-tensor-parallel-size 1; Liu et al. 2025, arXiv 2504.14960 sec.3): the
    experts stay whole (t_e = 1) and an EP group of e ranks spans the TP and CP ranks of a stage and
    e / (t c) of its DP ranks, e_dp = e / (t c): the expert data-parallel group is t c d / e ranks. With
    e < t c the group lies inside one TP x CP block (e_dp < 1: t c / e groups a block, each expert's
    weights on t c d / e ranks, the same count)."""
    if steps.never(plan.etp >= 1):
        return plan.ep, plan.tp
    folded = plan.etp >= 1
    return jnp.where(folded, plan.ep / (plan.tp * plan.cp), plan.ep), jnp.where(folded, 1.0, plan.tp)


def folds_experts(plan) -> bool:
    """Whether one concrete plan folds EP over TP x CP (``expert_split``: etp 1 with EP and a TP x CP block
    to fold over): what dse plan's and dse check's text say of it."""
    f = lambda x: float(np.asarray(x))  # noqa: E731
    return bool(f(plan.etp) >= 1 and f(plan.ep) > 1 and f(plan.tp) * f(plan.cp) > 1)


def derived(cluster, plan):
    """(d, d', m): data-parallel replicas, replicas of each expert shard (d / e; folded, the expert
    data-parallel group t c d / e: ``expert_split``), microbatches per pipeline."""
    d = cluster.gpus / (plan.tp * plan.cp * plan.pp)
    m = plan.gbs / (d * plan.mbs)
    return d, d / expert_split(plan)[0], m


def rank_dims(cluster, plan) -> dict:
    """The rank order's dimensions of one concrete plan as whole numbers (tp, cp, ep, pp, dp): the EP
    dimension is the share carved from DP (``expert_split``) and dp the DP' ranks (``derived``). A folded
    EP group inside one TP x CP block (e < t c: the block holds t c / e of them) takes no DP ranks: ep 1,
    dp d. The rank maps of dse check and dse rankmap read it."""
    f = lambda x: float(np.asarray(x))  # noqa: E731
    e_dp = f(expert_split(plan)[0])
    d, d_rep, _ = (f(x) for x in derived(cluster, plan))
    inside = e_dp < 1.0
    return dict(tp=int(f(plan.tp)), cp=int(f(plan.cp)), ep=1 if inside else int(round(e_dp)),
                pp=int(f(plan.pp)), dp=max(int(round(d if inside else d_rep)), 1))


@host_when_concrete   # one concrete plan (dse plan's and dse check's text): numpy, no eager XLA op
def hybrid_shard(d, plan):
    """(s, r): the data-parallel ranks one ZeRO shard group holds and the replicas of each shard.

    Hybrid sharding (HSDP: PyTorch FSDP HYBRID_SHARD, torchtitan's data_parallel_shard_degree and
    replicate degree, MaxText's fsdp and data axes) shards states over groups of s = Plan.dp_shard
    neighbouring DP ranks and all-reduces each shard's gradient across the r = d / s groups (with
    expert parallelism a group holds whole EP groups, and each expert's states shard over its s / e
    ranks: ``weight_replicas``). Only over sharded data parallelism (ZeRO >= 1); else (d, 1). None where the plan concretely does not
    set it (dp_shard 0: nothing traced, ``steps.never``). The one rule evaluate, dse plan's and dse
    check's text and the torchtitan exporter read."""
    if steps.never(plan.dp_shard > 0):
        return None
    s = jnp.where((plan.dp_shard > 0) & (plan.zero >= 1), jnp.minimum(plan.dp_shard, d), d)
    return s, d / s


def weight_replicas(d, d_rep, c, over_cp=1.0, shard=None, folded=0.0):
    """(dense, expert) ranks holding the same weights, the group that reduces their gradients
    and shards ZeRO states: d x c and d' x c. CP ranks split the tokens, not the weights, so
    their gradients are summed too (Megatron-Core reduces gradients and shards the distributed
    optimizer over the data-parallel-with-context-parallel group, parallel_state
    get_data_parallel_group(with_context_parallel=True)). ``over_cp`` = 0: d and d' (seed 000).
    ``shard`` (hybrid sharding, ``hybrid_shard``): the DP ranks a shard group holds instead of d.
    ``folded`` (Plan.etp = 1, ``expert_split``): d' is the whole expert data-parallel group, CP ranks
    included (t c d / e), so it is not multiplied again."""
    f = 1.0 + (c - 1.0) * (over_cp >= 1)
    fe = jnp.where(folded >= 1, 1.0, f)
    if shard is None:
        return d * f, d_rep * fe
    return shard * f, shard * (d_rep / d) * fe
