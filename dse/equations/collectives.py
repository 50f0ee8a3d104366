"""Collectives: bytes each rank sends and the time on the wire (alpha-beta).

Ring algorithms (Patarasuk & Yuan 2009; Thakur et al. 2005), for n ranks and an
S-byte buffer: all-reduce sends 2(n-1)/n S per rank in 2(n-1) steps; reduce-scatter
and all-gather (n-1)/n S in n-1 steps; all-to-all (n-1)/n S through the bisection.
"""

from __future__ import annotations

from dse.backend import jnp
from dse.equations import steps

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


def wire_time(bytes_sent, calls, steps_per_call, bandwidth, alpha, latency_on, copies=0.0, copy_s=0.0):
    """Time on the wire: bytes / bandwidth + calls * steps * alpha (alpha-beta model), plus
    ``copies`` buffer copies of ``copy_s`` each on the collective's stream (a per-rank tensor list,
    traffic.dp; concretely none: not traced)."""
    t = steps.safe_div(bytes_sent, bandwidth) + latency_on * calls * steps_per_call * alpha
    return t if steps.never(copies) else t + copies * copy_s


# ---------------------------------------------------------------- hierarchical (two-level)

def hierarchical_all_reduce_bytes(buffer, x, y):
    """Per-rank bytes of a hierarchical all-reduce of ``buffer`` bytes over x ranks a domain, y domains.

    Reduce-scatter inside the domain, all-reduce of the 1/x shard across domains on the
    rails (same local rank), all-gather inside the domain (Rail-only, Wang et al. 2023,
    sec.4; NCCL/HCCL hierarchical all-reduce). Returns (inside, across):
    inside 2 S (x-1)/x on the scale-up fabric, across 2 (S/x)(y-1)/y on the rails.
    """
    inside = 2.0 * buffer * steps.safe_div(x - 1.0, x)                 # RS + AG in the domain
    across = 2.0 * steps.safe_div(buffer, x) * steps.safe_div(y - 1.0, y)  # ring AR of S/x over y rails
    return inside, across


def two_phase_all_gather_bytes(D, x, y):
    """Bytes of the two-phase all-gather over x GPUs a domain and y domains (seed 000, Rail-only).

    ``D`` is the bytes one domain contributes (D/x a GPU). Phase 1 gathers across domains
    on each rail: a GPU receives y-1 shards of D/x, so D (y-1)/x a GPU crosses the network,
    all of it between same-rank GPUs (seed 000: "D(y-1)/x"). Phase 2 gathers inside the
    domain: each GPU sends its y shards to x-1 peers, D (x-1) for each domain's D of data
    (seed 000: "D(x-1)"), y D (x-1) in all. Returns (across a GPU, inside a domain).
    """
    across = D * (y - 1.0) / x       # seed 000: D(y-1)/x across the network, rail-local
    inside = y * D * (x - 1.0)       # seed 000: D(x-1) inside a domain per domain of data
    return across, inside


# ---------------------------------------------------------------- torus axes

def torus_ring_rate(link_bw, span, stride, wrap):
    """Per-rank rate of a ring on one torus axis (bytes/s a rank, per ring-all-reduce byte accounting).

    ``span`` ranks at ``stride`` links apart along an axis of ``link_bw`` per direction.
    With wraparound (the group spans the whole axis and the axis is closed) the ring is
    bidirectional: half the data each way, 2 B (Ying et al. 2018 sec.3.3, 2-D torus
    all-reduce on TPU pods). Without it the ring is embedded in a line, out on one
    direction and back on the other: each link carries it once a direction, B. Groups
    interleaved at stride s share every link s ways (Dally & Towles 2004, ch.3).
    """
    return link_bw * (1.0 + wrap) / stride


def torus_all_to_all_time_per_byte(link_bw, span, stride, wrap, sharpness=None):
    """Seconds per buffer byte of an all-to-all along one axis: max(injection, bisection).

    Each rank injects (g-1)/g of its buffer over two directions: (g-1)/(2g) / B.
    The bisection of a ring carries g/4 of a buffer a direction over 2 links (g/8 / B)
    with wraparound, over 1 link (g/4 / B) on a line (Dally & Towles 2004, sec.3.3,
    bisection of a k-ary n-cube). Groups interleaved at stride s share links s ways.
    """
    inject = steps.safe_div(span - 1.0, 2.0 * span)
    bisect = span / jnp.where(wrap > 0.5, 8.0, 4.0)
    on = 1.0 - steps.le(span, 1.0, sharpness)                   # an axis the group does not use costs nothing
    return on * stride * steps.maximum(inject, bisect, sharpness) / jnp.where(link_bw > 0, link_bw, 1.0)
