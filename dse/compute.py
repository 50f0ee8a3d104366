"""Compute: FLOPs a step and the time at the sustained rate."""

from __future__ import annotations

import jax.numpy as jnp

FULL_RECOMPUTE_FLOPS = 4.0 / 3.0  # one extra forward: (1 + 1 + 2) / (1 + 2) (seed 000 sec.6)


def model_flops(params_active, model, gbs):
    """6 Psi_active B s + 12 L B s^2 h FLOPs a step (seed 000 sec.6; PaLM App.B)."""
    s = model.seq
    return 6.0 * params_active * gbs * s + 12.0 * model.layers * gbs * s * s * model.hidden


def hardware_flops(flops, recompute):
    """x4/3 with full recompute (seed 000 sec.6); seed mode adds nothing for selective."""
    return flops * jnp.where(recompute >= 2, FULL_RECOMPUTE_FLOPS, 1.0)


def compute_time(hw_flops, gpus, sustained_flops_per_s):
    """Ideal step compute spread over N accelerators (seed 000 sec.6)."""
    return hw_flops / (gpus * sustained_flops_per_s)
