"""The degrees a plan implies: d = N/(t c p), d' = d/e, m = B/(d b) (seed 000, notation).

Written once; ``evaluate``, the placement equations, the operator tools and the CLI call it.
"""

from __future__ import annotations

__all__ = ["derived"]


def derived(cluster, plan):
    """(d, d' = d/e, m): data-parallel replicas, replicas of each expert shard, microbatches per pipeline."""
    d = cluster.gpus / (plan.tp * plan.cp * plan.pp)
    m = plan.gbs / (d * plan.mbs)
    return d, d / plan.ep, m
