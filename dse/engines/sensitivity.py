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
import numpy as np

from dse.backend import x64
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
    """{field: {"value": x, "d_step_dx": ds/dx (SI), "elasticity": (x/s) ds/dx}} at one plan.

    One compiled program of the rates (dse/engines/compiled.py ``load_or_compile``: kept in memory
    and on disk): the model, the plan, the fidelity and the cluster's other fields are its
    constants, as they are concrete to an eager ``jax.grad`` (a switch that is off traces nothing),
    so the numbers are the eager gradient's; its key holds their values. It runs once, so it is
    compiled for a short compile (COMPILE_FIRST: Llama 3 70B on 1,024 H100 compiled in 7.2 CPU-s with
    XLA's defaults; the whole first call, trace included, now takes 3.0; eager jax.grad, op by op,
    took 4.0 in a fresh process)."""
    from dse.engines.compiled import COMPILE_FIRST, compile_lowered, cpu_options, load_or_compile
    from dse.inputs.fidelity import resolve

    names = list(FIELDS)
    fid = jax.tree_util.tree_map(np.asarray, resolve(fidelity))
    const = jax.tree_util.tree_map(np.asarray, (model, cluster.replace(**{n: 0.0 for n in names}), plan, fid))

    def value_and_grad(xs):
        def step(xs):
            m, c, p, f = const
            return evaluate(m, c.replace(**dict(zip(names, xs))), p, f, sharpness=sharpness, network_cost=False).step_s
        return jax.value_and_grad(step)(xs)

    xs = [np.asarray(getattr(cluster, n), dtype=np.float64) for n in names]
    leaves = [(x.dtype.str, x.shape, x.tobytes()) for x in jax.tree_util.tree_leaves(const)]
    key = ("sensitivity", repr(sharpness), repr(jax.tree_util.tree_structure(const)), repr(leaves),
           tuple((x.shape, x.dtype.name) for x in xs))
    with x64():
        program = load_or_compile(key, lambda: compile_lowered(jax.jit(value_and_grad).lower(xs), cpu_options(COMPILE_FIRST)))
        s, grads = program(xs)
    s = float(s)
    out = {}
    for n, x, g in zip(names, xs, grads):
        g = float(g)
        out[n] = {"value": float(x), "d_step_dx": g, "elasticity": g * float(x) / s if s > 0 else 0.0}
    return out
