"""The degrees a plan implies: d = N/(t c p), d' = d/e, m = B/(d b) (seed 000, notation).

Written once; ``evaluate``, the placement equations, the operator tools and the CLI call it.
"""

from __future__ import annotations

from dse.backend import host_when_concrete, jnp
from dse.equations import steps

__all__ = ["derived", "weight_replicas", "hybrid_shard"]


def derived(cluster, plan):
    """(d, d' = d/e, m): data-parallel replicas, replicas of each expert shard, microbatches per pipeline."""
    d = cluster.gpus / (plan.tp * plan.cp * plan.pp)
    m = plan.gbs / (d * plan.mbs)
    return d, d / plan.ep, m


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


def weight_replicas(d, d_rep, c, over_cp=1.0, shard=None):
    """(dense, expert) ranks holding the same weights, the group that reduces their gradients
    and shards ZeRO states: d x c and d' x c. CP ranks split the tokens, not the weights, so
    their gradients are summed too (Megatron-Core reduces gradients and shards the distributed
    optimizer over the data-parallel-with-context-parallel group, parallel_state
    get_data_parallel_group(with_context_parallel=True)). ``over_cp`` = 0: d and d' (seed 000).
    ``shard`` (hybrid sharding, ``hybrid_shard``): the DP ranks a shard group holds instead of d."""
    f = 1.0 + (c - 1.0) * (over_cp >= 1)
    if shard is None:
        return d * f, d_rep * f
    return shard * f, shard * (d_rep / d) * f
