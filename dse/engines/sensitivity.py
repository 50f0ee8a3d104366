"""Sensitivities of the step time to the hardware, by ``jax.grad`` through ``evaluate``.

For each cluster rate (bandwidths, FLOP/s, HBM, latencies) the derivative
d(step)/d(x) in SI units and the elasticity (x / step) d(step)/d(x): the percent
change of the step per percent change of x (-1: the step scales as 1/x, 0: x does
not limit this plan). The exact model (``sharpness=None``) is piecewise smooth, so
these are one-sided at a kink (a plan exactly at a tier boundary or where DP just
hides behind compute); ``sharpness`` gives the smooth relaxation's instead.
"""

from __future__ import annotations

import jax

from dse.backend import jnp
from dse.evaluate import evaluate
from dse.inputs import Cluster, ModelShape, Plan

__all__ = ["FIELDS", "sensitivities"]

# Cluster field -> (label, display unit, factor from SI to the display unit)
FIELDS = {
    "bw_up_bytes_per_s": ("scale-up bandwidth", "GB/s", 1e-9),
    "bw_out_bytes_per_s": ("scale-out bandwidth", "GB/s", 1e-9),
    "peak_flops_per_s": ("FLOP/s", "TFLOP/s", 1e-12),
    "hbm_bytes": ("HBM capacity", "GB", 1e-9),
    "alpha_up_s": ("scale-up latency", "us", 1e6),
    "alpha_out_s": ("scale-out latency", "us", 1e6),
}


def sensitivities(model: ModelShape, cluster: Cluster, plan: Plan, fidelity="seed", *,
                  sharpness=None) -> dict:
    """{field: {"value": x, "d_step_dx": ds/dx (SI), "elasticity": (x/s) ds/dx}} at one plan."""
    names = list(FIELDS)

    def step(xs):
        c = cluster.replace(**dict(zip(names, xs)))
        return evaluate(model, c, plan, fidelity, sharpness=sharpness).step_s

    xs = [jnp.asarray(getattr(cluster, n), dtype=jnp.result_type(float)) for n in names]
    s, grads = jax.value_and_grad(step)(xs)
    out = {}
    for n, x, g in zip(names, xs, grads):
        el = jnp.where(s > 0, g * x / s, 0.0)
        out[n] = {"value": float(x), "d_step_dx": float(g), "elasticity": float(el)}
    return out
