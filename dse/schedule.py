"""Pipeline schedule and overlap: the bubble, and what communication stays exposed."""

from __future__ import annotations

from dse import steps


def bubble_fraction(p, m, v):
    """(p-1)/m of ideal compute for GPipe and 1F1B; (p-1)/(v m) interleaved (Narayanan sec.2.2)."""
    return (p - 1.0) / (v * m)


def exposed(wire_s, overlap):
    """Wire time not hidden: (1 - overlap) * wire (seed: TP, PP, EP, CP fully exposed)."""
    return (1.0 - overlap) * wire_s


def exposed_dp(wire_s, compute_s, dp_overlap, sharpness=None):
    """max(0, t_DP - 2/3 compute): DP hides behind the backward pass (seed 000 sec.6)."""
    return steps.relu(wire_s - dp_overlap * compute_s, sharpness)
