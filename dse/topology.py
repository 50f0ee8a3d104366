"""Placement of parallel dimensions on the cluster.

Ranks are numbered [TP, CP, EP, PP, DP'] innermost first (Llama 3 sec.3.3.2 orders
[TP, CP, PP, DP]; seed 000 slots EP just outside TP). A group whose outermost varying
dimension has stride S and size G lies inside a domain of U ranks iff S*G <= U
(seed 000, "Rank layout"); a ring is as slow as its slowest hop, so a group that
leaves the domain runs at the scale-out rate.
"""

from __future__ import annotations

import jax.numpy as jnp

from dse import steps

DIMS = ("tp", "cp", "ep", "pp", "dp")  # innermost first


def strides(t, c, e, p):
    """Rank stride of each dimension: r = t_i + t (c_i + c (e_i + e (p_i + p d'_i)))."""
    return {"tp": jnp.ones_like(t), "cp": t, "ep": t * c, "pp": t * c * e, "dp": t * c * e * p}


def group_inside(stride, size, domain, sharpness=None):
    """1 when a group of ``size`` ranks at ``stride`` fits one domain: S*G <= U (seed 000)."""
    return steps.le(stride * size, domain, sharpness)


def placement(t, c, e, p, d_rep, domain, sharpness=None):
    """Inside-the-domain indicator per group.

    ``dp`` is the dense-weight DP group (EP x DP' ranks), ``dp_expert`` the expert-weight
    DP group (DP' ranks). A size-1 dimension has no traffic; it reports inside.
    """
    st = strides(t, c, e, p)
    one = jnp.ones_like(t)
    inside = {
        "tp": group_inside(st["tp"], t, domain, sharpness),
        "cp": group_inside(st["cp"], c, domain, sharpness),
        "ep": group_inside(st["ep"], e, domain, sharpness),
        "pp": group_inside(st["pp"], p, domain, sharpness),
    }
    # Expert DP spans DP' only; dense DP spans EP and DP' (outermost varying dim decides).
    dpe = group_inside(st["dp"], d_rep, domain, sharpness)
    dense_outer = jnp.where(d_rep > 1, dpe, group_inside(st["ep"], e, domain, sharpness))
    inside["dp"] = dense_outer
    inside["dp_expert"] = dpe
    for k, size in (("tp", t), ("cp", c), ("ep", e), ("pp", p)):
        inside[k] = jnp.where(size > 1, inside[k], one)
    inside["dp_expert"] = jnp.where(d_rep > 1, dpe, one)
    inside["dp"] = jnp.where(d_rep * e > 1, dense_outer, one)
    return inside


def bandwidth(inside, cluster, up_efficiency=1.0, out_efficiency=1.0):
    """Scale-up rate inside a domain, scale-out otherwise (seed 000 sec.6: 450 / 50 GB/s),
    times the achieved share of each (nccl-tests bus bandwidth / nominal; seed: 1)."""
    return steps.where(inside, cluster.bw_up_bytes_per_s * up_efficiency,
                       cluster.bw_out_bytes_per_s * out_efficiency)


def alpha(inside, cluster):
    return steps.where(inside, cluster.alpha_up_s, cluster.alpha_out_s)
