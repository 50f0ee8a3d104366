"""The degrees a plan implies: d = N/(t c p), d' = d/e, m = B/(d b) (seed 000, notation).

Written once; ``evaluate``, the placement equations, the operator tools and the CLI call it.
"""

from __future__ import annotations

__all__ = ["derived", "weight_replicas"]


def derived(cluster, plan):
    """(d, d' = d/e, m): data-parallel replicas, replicas of each expert shard, microbatches per pipeline."""
    d = cluster.gpus / (plan.tp * plan.cp * plan.pp)
    m = plan.gbs / (d * plan.mbs)
    return d, d / plan.ep, m


def weight_replicas(d, d_rep, c, over_cp=1.0):
    """(dense, expert) ranks holding the same weights, the group that reduces their gradients
    and shards ZeRO states: d x c and d' x c. CP ranks split the tokens, not the weights, so
    their gradients are summed too (Megatron-Core reduces gradients and shards the distributed
    optimizer over the data-parallel-with-context-parallel group, parallel_state
    get_data_parallel_group(with_context_parallel=True)). ``over_cp`` = 0: d and d' (seed 000)."""
    f = 1.0 + (c - 1.0) * (over_cp >= 1)
    return d * f, d_rep * f
