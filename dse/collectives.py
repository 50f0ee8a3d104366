"""Collectives: bytes each rank sends and the time on the wire (alpha-beta).

Ring algorithms (Patarasuk & Yuan 2009; Thakur et al. 2005), for n ranks and an
S-byte buffer: all-reduce sends 2(n-1)/n S per rank in 2(n-1) steps; reduce-scatter
and all-gather (n-1)/n S in n-1 steps; all-to-all (n-1)/n S through the bisection.
"""

from __future__ import annotations

import jax.numpy as jnp

from dse import steps

ALL_REDUCE = "all-reduce"
REDUCE_SCATTER = "reduce-scatter"
ALL_GATHER = "all-gather"
ALL_TO_ALL = "all-to-all"
SEND_RECV = "send/recv"


def ring_fraction(kind: str, n):
    """Per-rank bytes sent per buffer byte: 2(n-1)/n or (n-1)/n (seed 000 sec.3)."""
    frac = steps.safe_div(n - 1.0, n)
    if kind == ALL_REDUCE:
        return 2.0 * frac
    if kind in (REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL):
        return frac
    if kind == SEND_RECV:
        return jnp.ones_like(n)
    raise ValueError(f"collective: unknown kind {kind!r}")


def ring_steps(kind: str, n):
    """Latency steps of one call: 2(n-1) for a ring all-reduce, n-1 for RS/AG/A2A, 1 for p2p."""
    if kind == ALL_REDUCE:
        return 2.0 * (n - 1.0)
    if kind in (REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL):
        return n - 1.0
    if kind == SEND_RECV:
        return jnp.ones_like(n)
    raise ValueError(f"collective: unknown kind {kind!r}")


def wire_time(bytes_sent, calls, steps_per_call, bandwidth, alpha, latency_on):
    """Time on the wire: bytes / bandwidth + calls * steps * alpha (alpha-beta model)."""
    return steps.safe_div(bytes_sent, bandwidth) + latency_on * calls * steps_per_call * alpha
