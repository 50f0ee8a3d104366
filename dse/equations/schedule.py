"""Pipeline schedule and overlap: the bubble, and what communication stays exposed."""

from __future__ import annotations

import jax.numpy as jnp

from dse.equations import steps


# Zero Bubble (Qi et al. 2024, sec.2): forward F, input-gradient backward and weight-gradient
# backward W take equal time, so W is 1/3 and the full backward B is 2/3 of F + B.
W_SHARE = 1.0 / 3.0
B_SHARE = 2.0 / 3.0


# The formula bubble_fraction evaluates for each schedule code (inputs.SCHEDULES), as a reader writes it.
BUBBLE_FORMULAS = {0: "(p-1)/(v m)", 1: "ZB1P (p-1)(1-2W)/m", 2: "DualPipe (p/2-1)(1+B-3W)/m"}


def bubble_fraction(p, m, v, schedule=0.0):
    """Pipeline bubble as a share of ideal compute m (F + B), per schedule.

    1F1B: (p-1)/m, interleaved (p-1)/(v m) (Narayanan sec.2.2). DeepSeek-V3 Table 2:
    ZB1P (p-1)(F+B-2W), DualPipe (p/2-1)(F&B + B - 3W) with F&B = F + B (the pair's
    communication, not its compute, is overlapped).
    """
    one_f_one_b = (p - 1.0) / (v * m)
    zb1p = (p - 1.0) * (1.0 - 2.0 * W_SHARE) / m
    dualpipe = steps.relu(p / 2.0 - 1.0) * (1.0 + B_SHARE - 3.0 * W_SHARE) / m
    return jnp.where(schedule >= 2, dualpipe, jnp.where(schedule >= 1, zb1p, one_f_one_b))


def exposed(wire_s, overlap):
    """Wire time not hidden: (1 - overlap) * wire (seed: TP, PP, EP, CP fully exposed)."""
    return (1.0 - overlap) * wire_s


def hide_window(compute_s, overlap, enabled=1.0):
    """Compute a collective can hide behind: 2/3 of it for DP, the backward pass (seed 000 sec.6);
    none when the overlap is switched off (``enabled`` = 0, Megatron's --overlap-grad-reduce)."""
    return enabled * overlap * compute_s


def exposed_dp(wire_s, compute_s, dp_overlap, sharpness=None, enabled=1.0):
    """max(0, t_DP - 2/3 compute): DP hides behind the backward pass (seed 000 sec.6)."""
    return steps.relu(wire_s - hide_window(compute_s, dp_overlap, enabled), sharpness)



def unprefetched(wire_s, calls, first_calls):
    """ZeRO-3/FSDP: the first unit's weight gather of each microbatch has nothing to hide
    behind (FSDP, Zhao et al. 2023 sec.3.4: prefetching overlaps the *next* unit's gather):
    ``first_calls`` calls of the average call time stay exposed."""
    return steps.safe_div(wire_s, calls) * first_calls
