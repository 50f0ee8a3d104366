"""Placement of parallel dimensions on the cluster: rank order, tiers, islands, rails, torus.

Ranks are numbered [TP, CP, EP, PP, DP'] innermost first by default (seed 000 "Rank
layout"; Megatron-Core's parallel_state orders tp-cp-ep-dp-pp); ``Plan.rank_order`` picks
any other permutation (an index into RANK_ORDERS). A group whose outermost varying
dimension has stride S and size G lies inside a domain of U ranks iff S*G <= U (seed
000, "Rank layout"); a ring is as slow as its slowest hop, so a group that leaves the
domain runs at the scale-out rate.

Topologies (``Cluster.topology``, see inputs.TOPOLOGIES) are data:
- fat tree (0): the seed's two tiers; with ``island_gpus`` > 0, three: domain, a
  non-blocking island, and a core oversubscribed by ``oversubscription`` (seed 001).
- rail-only (1): GPUs of the same local rank share a rail switch and there is no
  spine; cross-rail traffic is forwarded through the scale-up domain (Rail-only, Wang
  et al. 2023, sec.5).
- torus (2): 1-3 axes with per-link bandwidth; ranks fill the axes in the order
  ``Plan.torus_order`` (an index into TORUS_ORDERS), so each parallel dimension lands
  on one or more axes (TPU v4, Jouppi et al. 2023, sec.2-3).
"""

from __future__ import annotations

import itertools

import numpy as np

from dse.backend import host_when_concrete, jnp
from dse.equations import collectives as col
from dse.equations import steps
from dse.equations.degrees import derived, expert_split
from dse.errors import InputError

DIMS = ("tp", "cp", "ep", "pp", "dp")  # default order, innermost first
AXES = ("x", "y", "z")
# Every order of the five dimensions (innermost first); index 0 is the default order.
RANK_ORDERS = tuple(itertools.permutations(range(len(DIMS))))
# Every order in which ranks fill the torus axes (first = fastest); index 0 is x, y, z.
TORUS_ORDERS = tuple(itertools.permutations(range(len(AXES))))
_RANK_POS = np.array([[perm.index(k) for k in range(len(DIMS))] for perm in RANK_ORDERS], float)
_TORUS_POS = np.array([[perm.index(k) for k in range(len(AXES))] for perm in TORUS_ORDERS], float)

RING, A2A, P2P = "ring", "all-to-all", "p2p"
KIND = {"tp": RING, "cp": RING, "ep": A2A, "pp": P2P, "dp": RING, "dp_expert": RING, "dp_replica": RING}


# ---------------------------------------------------------------- codes <-> names

def rank_order_code(names) -> int:
    """Index into RANK_ORDERS of an order given innermost first ("tp,dp,pp"); missing dims follow in default order."""
    names = [n.strip().lower() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    bad = [n for n in names if n not in DIMS]
    if bad or len(set(names)) != len(names):
        raise InputError(f"rank order: {','.join(names)!r} is not allowed; allowed: distinct names from {', '.join(DIMS)}")
    full = names + [n for n in DIMS if n not in names]
    return RANK_ORDERS.index(tuple(DIMS.index(n) for n in full))


def rank_order_names(code) -> list[str]:
    return [DIMS[k] for k in RANK_ORDERS[int(code)]]


def torus_order_code(axes: str) -> int:
    """Index into TORUS_ORDERS of a fill order such as "yzx" (first axis fastest)."""
    a = axes.strip().lower()
    if sorted(a) != sorted(AXES):
        raise InputError(f"torus order: {axes!r} is not allowed; allowed: a permutation of xyz, e.g. xyz, zyx")
    return TORUS_ORDERS.index(tuple(AXES.index(ch) for ch in a))


def _positions(code, table):
    """Position of each item in the order picked by ``code`` (a float array of indices)."""
    idx = jnp.asarray(code).astype(jnp.int32)
    # whole positions (no float64 enters a float32 sweep); ``take``, not indexing, so a traced code
    # reaches jax's gather and a concrete one numpy's (backend.folding)
    g = jnp.take(table.astype(np.int32), idx, axis=0, mode="clip")
    return [g[..., j] for j in range(table.shape[1])]


def _inner_products(sizes, pos):
    """For each item, the product of the sizes of the items placed before it (mixed-radix strides)."""
    out = []
    for k in range(len(sizes)):
        s = jnp.ones_like(sizes[k])
        for j in range(len(sizes)):
            if j != k:
                s = s * jnp.where(pos[j] < pos[k], sizes[j], 1.0)
        out.append(s)
    return out


# ---------------------------------------------------------------- strides and the domain rule

def strides(t, c, e, p, d_rep=1.0, order=0.0):
    """Rank stride of each dimension: the product of the sizes of the dimensions inside it.

    Default order: r = t_i + t (c_i + c (e_i + e (p_i + p d'_i))) (seed 000, "Rank layout").
    """
    sizes = (t, c, e, p, jnp.ones_like(t) * d_rep)
    return dict(zip(DIMS, _inner_products(sizes, _positions(order, _RANK_POS))))


def group_inside(stride, size, domain, sharpness=None):
    """1 when a group of ``size`` ranks at ``stride`` fits one domain: S*G <= U (seed 000)."""
    return steps.le(stride * size, domain, sharpness)


def placement(t, c, e, p, d_rep, domain, sharpness=None, order=0.0):
    """Inside-the-domain indicator per group.

    ``dp`` is the dense-weight DP group (EP x DP' ranks), ``dp_expert`` the expert-weight
    DP group (DP' ranks). A size-1 dimension has no traffic; it reports inside.
    """
    st = strides(t, c, e, p, d_rep, order)
    pos = _positions(order, _RANK_POS)
    one = jnp.ones_like(t)
    inside = {
        "tp": group_inside(st["tp"], t, domain, sharpness),
        "cp": group_inside(st["cp"], c, domain, sharpness),
        "ep": group_inside(st["ep"], e, domain, sharpness),
        "pp": group_inside(st["pp"], p, domain, sharpness),
    }
    # Expert DP spans DP' only; dense DP spans EP and DP' (outermost varying dim decides).
    dpe = group_inside(st["dp"], d_rep, domain, sharpness)
    ep_in = group_inside(st["ep"], e, domain, sharpness)
    dense_outer = jnp.where(d_rep > 1, jnp.where((e > 1) & (pos[2] > pos[4]), ep_in, dpe), ep_in)
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


# ---------------------------------------------------------------- group footprints

def _members_per(block, stride, size, k=None):
    """Members of a strided group inside one aligned block of ``block`` ranks: clip(block/S, 1, G)."""
    return steps.minimum(steps.maximum(block / stride, 1.0, k), size, k)


def _torus_sizes(cluster):
    return (cluster.torus_x, cluster.torus_y, cluster.torus_z)


def _torus_link_bw(cluster):
    return (cluster.torus_bw_x_bytes_per_s, cluster.torus_bw_y_bytes_per_s, cluster.torus_bw_z_bytes_per_s)


def _axis_prefix(cluster, torus_order):
    """Rank stride of each physical axis: product of the axes ranks fill before it."""
    pos = _positions(torus_order, _TORUS_POS)
    return _inner_products(_torus_sizes(cluster), pos), pos


def _axis_footprint(stride, size, cluster, torus_order, k=None):
    """Per axis: members g_j of the group along the axis and their spacing s_j in links.

    Rank offsets i*S, i < G, written in the mixed radix of the axes: on axis j (rank
    stride P_j, n_j chips) the group covers [max(S, P_j), min(S G, P_j n_j)) in steps of
    max(S, P_j), so g_j = min(SG, P_j n_j) / max(S, P_j) and s_j = max(S/P_j, 1).
    """
    prefix, _ = _axis_prefix(cluster, torus_order)
    n = _torus_sizes(cluster)
    g, s = [], []
    for j in range(len(AXES)):
        lo = steps.maximum(stride, prefix[j], k)
        hi = steps.minimum(stride * size, prefix[j] * n[j], k)
        g.append(steps.maximum(hi / lo, 1.0, k))
        s.append(steps.maximum(stride / prefix[j], 1.0, k))
    return g, s


def maybe_torus(cluster) -> bool:
    """False when the cluster is concretely not a torus anywhere (``steps.never``): its torus terms
    need not be worked out nor traced."""
    return not steps.never(cluster.topology == 2)


def dp_layout(d_rep, plan, hybrid):
    """(the DP' ranks of the group DP's traffic is laid on, the replicas of each shard): (d', None)
    without hybrid sharding; with it (``hybrid`` = degrees.hybrid_shard's (s, r)) a shard group's s / e
    DP' ranks and its r replicas (the ``replicas`` of ``groups`` and ``network``). evaluate and dse
    check lay DP out through it."""
    if hybrid is None:
        return d_rep, None
    s, r = hybrid
    return s / expert_split(plan)[0], r


def groups(cluster, plan, d_rep, sharpness=None, replicas=None):
    """Stride, size and footprints (per domain, island, torus axis) of every communicating group.
    On a cluster that is concretely not a torus (``steps.never``) the torus axes' footprints
    (``ax_g``, ``ax_s``) are None: nothing reads them there, so they are neither worked out nor traced.
    ``replicas`` (hybrid sharding, degrees.hybrid_shard): ``d_rep`` is then a shard group's DP ranks, and
    ``dp_replica`` the group of ranks holding the same shard, ``replicas`` of them d_rep DP ranks apart."""
    k = sharpness
    t, c, p = plan.tp, plan.cp, plan.pp
    e = expert_split(plan)[0]                         # the EP share carved from DP (folded: e / (t c))
    st = strides(t, c, e, p, d_rep, plan.rank_order)
    size = {"tp": t, "cp": c, "ep": e, "pp": p, "dp": d_rep}
    U = cluster.domain
    I = jnp.where(cluster.island_gpus > 0, cluster.island_gpus, cluster.gpus)   # 0: one island
    torus = maybe_torus(cluster)
    out = {}
    extra = {} if replicas is None else {"dp_replica": (st["dp"] * d_rep, replicas)}
    for name, (S, G) in {**{n: (st[n], size[n]) for n in DIMS}, **extra}.items():
        ax_g, ax_s = _axis_footprint(S, G, cluster, plan.torus_order, k) if torus else (None, None)
        out[name] = dict(stride=S, size=G, dom=_members_per(U, S, G, k), isl=_members_per(I, S, G, k),
                         in_island=steps.le(S * G, I, k), ax_g=ax_g, ax_s=ax_s, torus_order=plan.torus_order)
    # Dense DP = EP x DP' ranks (seed 000): counts multiply; the inner dim's spacing sets the rate.
    ep_, dp_ = out["ep"], out["dp"]
    if not steps.never(plan.etp >= 1):
        out["ep"] = _folded_ep(out, plan, cluster, U, I, k, torus)
    pos = _positions(plan.rank_order, _RANK_POS)
    ep_inner = pos[2] < pos[4]
    out["dp_dense"] = dict(stride=jnp.where(ep_inner & (e > 1), ep_["stride"], dp_["stride"]), size=e * d_rep,
                           dom=ep_["dom"] * dp_["dom"], isl=ep_["isl"] * dp_["isl"],
                           in_island=jnp.minimum(ep_["in_island"], dp_["in_island"]), ax_g=None, ax_s=None)
    if torus:
        out["dp_dense"]["ax_g"] = [a * b for a, b in zip(ep_["ax_g"], dp_["ax_g"])]
        out["dp_dense"]["ax_s"] = [jnp.where(ep_inner & (e > 1), a, b) for a, b in zip(ep_["ax_s"], dp_["ax_s"])]
    return out


def _folded_ep(out, plan, cluster, U, I, k, torus):
    """The group a folded EP all-to-all runs over (Plan.etp = 1, degrees.expert_split): the TP, CP and
    e / (t c) DP ranks of the three innermost dimensions (feasibility's etp_layout rule), one block
    of e consecutive ranks at the innermost stride (Megatron-Core's expert rank generator,
    tp-ep-dp-pp with ETP innermost); the EP dimension's own group where the plan does not fold."""
    ep_ = out["ep"]
    on = (plan.etp >= 1) & (plan.ep > 1)
    S = jnp.minimum(jnp.minimum(out["tp"]["stride"], out["cp"]["stride"]), ep_["stride"])
    G = plan.ep
    ax_g, ax_s = _axis_footprint(S, G, cluster, plan.torus_order, k) if torus else (None, None)
    pick = lambda a, b: jnp.where(on, a, b)   # noqa: E731
    return dict(stride=pick(S, ep_["stride"]), size=pick(G, ep_["size"]), dom=pick(_members_per(U, S, G, k), ep_["dom"]),
                isl=pick(_members_per(I, S, G, k), ep_["isl"]), in_island=pick(steps.le(S * G, I, k), ep_["in_island"]),
                ax_g=None if not torus else [pick(a, b) for a, b in zip(ax_g, ep_["ax_g"])],
                ax_s=None if not torus else [pick(a, b) for a, b in zip(ax_s, ep_["ax_s"])],
                torus_order=plan.torus_order)


def folds_inside(order):
    """1 where TP, CP and EP are the three innermost dimensions of the rank order, so that a folded
    EP group (Plan.etp = 1) is one contiguous block of ranks (feasibility's etp_layout rule)."""
    pos = _positions(order, _RANK_POS)
    return (pos[0] < 3) & (pos[1] < 3) & (pos[2] < 3)


def _is_int(x):
    return jnp.abs(x - jnp.round(x)) < 1e-9 * jnp.maximum(jnp.abs(x), 1.0)


def torus_mapping_valid(grp, cluster):
    """1 where the torus holds every rank once and each group splits exactly onto its axes.

    A group splits when its members on each axis are whole (the product of g_j is G), it
    starts on a link boundary (S/P_j whole) and its groups tile the axis (P_j n_j and S G
    divide one another); otherwise a group would wrap from one row into the next.
    """
    n = _torus_sizes(cluster)
    prefix, _ = _axis_prefix(cluster, grp["tp"]["torus_order"])
    ok = jnp.abs(n[0] * n[1] * n[2] - cluster.gpus) < 0.5
    for name in DIMS:
        g = grp[name]
        S, G = g["stride"], g["size"]
        prod = g["ax_g"][0] * g["ax_g"][1] * g["ax_g"][2]
        good = jnp.abs(prod - G) < 1e-6 * G
        for j in range(len(AXES)):
            block = prefix[j] * n[j]
            tiles = _is_int(block / (S * G)) | _is_int(S * G / block)
            good = good & ((g["ax_g"][j] <= 1) | (_is_int(jnp.maximum(S, prefix[j]) / prefix[j]) & tiles))
        ok = ok & ((G <= 1) | good)
    return ok


# ---------------------------------------------------------------- time on a switched fabric

def _core_factor(kind, g, cluster, k=None):
    """Slow-down of a group that leaves its island through a core oversubscribed r:1 (seed 001).

    A ring or pipeline with m members an island sends one hop out per group: I/m groups
    share the island's I B/r uplinks, so it runs at B min(1, m/r). An all-to-all sends
    the share 1 - m/G of its bytes through the core: max(1, r (1 - m/G)) (seed 001: the
    same 512-rank all-to-all, 21 GB/s across islands vs 61 packed in one, ~3x).
    """
    r = cluster.oversubscription
    if kind == A2A:
        cf = steps.maximum(r * (1.0 - g["isl"] / g["size"]), 1.0, k)
    else:
        cf = steps.maximum(r / g["isl"], 1.0, k)
    fat_tree = jnp.where(cluster.topology == 0, 1.0, 0.0)
    return steps.where(fat_tree * (1.0 - g["in_island"]), cf, jnp.ones_like(cf))


def _rail_forward_share(kind, g, cluster):
    """Share of a cross-domain group's bytes forwarded through the scale-up domain on rail-only.

    Rings cross domains between same-rank GPUs (rail-aligned), so none. An all-to-all of G
    ranks with m a domain sends to G-m remote peers, of which G/m-1 share its rail: the
    rest, (G - m - (G/m - 1))/(G - 1) of its bytes, take an extra scale-up hop (Rail-only
    sec.5: 8.2-11.2% all-to-all overhead, about B_out/B_up). A pipeline hop at stride S
    changes rail unless S is a multiple of U.
    """
    rail = jnp.where(cluster.topology == 1, 1.0, 0.0)
    G, m = g["size"], g["dom"]
    if kind == A2A:
        share = steps.safe_div(G - m - (steps.safe_div(G, m) - 1.0), G - 1.0)
    elif kind == P2P:
        q = g["stride"] / cluster.domain
        share = jnp.where(jnp.floor(q) == q, 0.0, 1.0)
    else:
        share = jnp.zeros_like(G)
    return rail * share


def _node_limited_out_share(g, topk, limit, groups=0.0):
    """Scale-out bytes of an EP all-to-all with node-limited routing, as a share of the flat volume.

    DeepSeek-V3 sec.3.2.2: a token goes to experts on at most M nodes and crosses the
    scale-out network once per destination node (to the same in-node index); NVLink fans
    it out. With D domains in the group, k experts picked uniformly hit D (1 - (1-1/D)^k)
    distinct domains; the token reaches min(M_D, that) of them, (1 - 1/D) of which are
    remote. The limit counts expert groups (config.json: topk_group of n_group, DeepSeek-V2
    sec.2.2.2 device-limited, V3 node-limited routing): ``groups`` = n_group splits the EP
    group's experts into n_group blocks of ranks, so one group spans max(1, D / n_group)
    domains and M groups reach at most M_D = M max(1, D / n_group) of them (groups 0: one
    group a domain, M_D = M). The flat all-to-all sends k (G-1)/G copies a token.
    """
    D = steps.safe_div(g["size"], g["dom"])
    distinct = D * (1.0 - (1.0 - steps.safe_div(1.0, D)) ** topk)
    span = jnp.where(groups > 0, jnp.maximum(steps.safe_div(D, groups), 1.0), 1.0)
    nodes = jnp.minimum(limit * span, distinct)
    remote = nodes * (1.0 - steps.safe_div(1.0, D))
    flat = topk * steps.safe_div(g["size"] - 1.0, g["size"])
    return jnp.where(limit > 0, steps.safe_div(remote, flat), 1.0)


# Each path returns an effective rate (bytes a rank sends / seconds) and the shares of
# those bytes on the scale-up and scale-out tiers. Rates depend on degrees and the
# cluster only, not on volumes, so a sweep broadcasts them over few axes; evaluate's
# volumes divide by them once (seed 000 sec.6: t_X = volume / bandwidth).

def _switched(kind, g, inside, cluster, out_share, node_limited, k=None, local=0.0):
    """Rate and tier shares of one group on a fat tree or rail-only fabric.

    Outside the domain a byte costs out_share * cf / B_out (the core's slow-down cf) plus
    the rail-only forwarding hop fwd / B_up; node-limited routing runs its scale-out and
    NVLink legs at once (DeepSeek-V3 sec.3.2.2), so the slower leg sets the rate. ``local``: the
    share of a flat all-to-all's bytes bound for peers in the rank's own domain, sent over NVLink
    while the rest crosses the network (``out_share`` the remote share); the slower leg sets the rate.
    """
    up_bw, out_bw = cluster.bw_up_bytes_per_s, cluster.bw_out_bytes_per_s
    cf = _core_factor(kind, g, cluster, k)
    fwd = _rail_forward_share(kind, g, cluster)
    rate_out = steps.safe_div(out_bw, out_share * cf + fwd * steps.safe_div(out_bw, up_bw))
    fan_out = 0.0
    if node_limited is not None:   # a token goes to the same in-node index: rail-aligned, no forwarding
        fwd = jnp.where(node_limited, 0.0, fwd)
        rate_out = steps.safe_div(out_bw, out_share * cf + fwd * steps.safe_div(out_bw, up_bw))
        rate_out = jnp.where(node_limited, jnp.minimum(rate_out, up_bw), rate_out)
        fan_out = jnp.where(node_limited, 1.0, 0.0)                      # every copy fans out on NVLink
    if not steps.never(local > 0):
        rate_out = jnp.where(local > 0, jnp.minimum(rate_out, steps.safe_div(up_bw, local)), rate_out)
    rate = steps.where(inside, up_bw, rate_out)
    up = steps.where(inside, jnp.ones_like(rate), fwd + fan_out + local)
    out = steps.where(inside, jnp.zeros_like(rate), out_share * jnp.ones_like(rate))
    return rate, up, out


def _hierarchical_dp(g, cluster, k=None):
    """DP all-reduce as RS in the domain, AR across domains on the rails, AG in the domain (Rail-only sec.4).

    Per buffer byte: 2(x-1)/x on the scale-up fabric, 2(y-1)/(xy) on the rails
    (collectives.hierarchical_all_reduce_bytes); the flat ring's volume is 2(G-1)/G.
    """
    G = g["size"]
    x = g["dom"]                                   # DP ranks in one domain
    y = steps.safe_div(G, x)                       # domains the group spans
    b_in, b_out = col.hierarchical_all_reduce_bytes(1.0, x, y)
    rail = dict(g, isl=steps.maximum(g["isl"] / x, 1.0, k), size=y)   # one member a domain on each rail
    cf = _core_factor(RING, rail, cluster, k)
    spb = steps.safe_div(b_in, cluster.bw_up_bytes_per_s) + steps.safe_div(b_out, cluster.bw_out_bytes_per_s) * cf
    flat = col.ring_fraction(col.ALL_REDUCE, G)
    rate = steps.safe_div(flat, spb)
    return rate, steps.safe_div(b_in, flat), steps.safe_div(b_out, flat)


def _hierarchical_alpha(g, cluster):
    """Latency a ring step: 2(x-1) steps in the domain and 2(y-1) across, of the flat ring's 2(G-1)."""
    G, x = g["size"], g["dom"]
    y = steps.safe_div(G, x)
    return (steps.safe_div(x - 1.0, G - 1.0) * cluster.alpha_up_s
            + steps.safe_div(y - 1.0, G - 1.0) * cluster.alpha_out_s)


# ---------------------------------------------------------------- time on a torus

def _torus(kind, g, cluster, k=None):
    """Rate of one group on the torus: per-axis phases (Ying et al. 2018 sec.3.3; Dally & Towles ch.3).

    A ring collective runs as a reduce-scatter along each axis in fill order on a shrinking
    buffer, then all-gathers in reverse (multi-axis all-reduce): bytes / rate with
    1/rate = sum_j (g_j-1)/g_j / (prod_{i before j} g_i) / rate_j, over (G-1)/G.
    An all-to-all runs one phase an axis on the whole buffer; a pipeline hop runs at the
    slowest axis it uses.
    """
    G = g["size"]
    n = _torus_sizes(cluster)
    bw = _torus_link_bw(cluster)
    ax_g, ax_s = g["ax_g"], g["ax_s"]
    # wraparound links serve a group that spans its whole axis: n_j <= s_j g_j
    wrap = [cluster.torus_wrap * steps.le(n[j] * (1.0 - 1e-9), ax_s[j] * ax_g[j], k) for j in range(3)]
    frac = steps.safe_div(G - 1.0, G)
    if kind == RING:
        per_byte = 0.0
        before = _inner_products(ax_g, g["fill_pos"])        # shard left after the earlier axes' RS
        for j in range(3):
            rate = col.torus_ring_rate(bw[j], ax_g[j], ax_s[j], wrap[j])
            term = steps.safe_div(steps.safe_div(ax_g[j] - 1.0, ax_g[j]), before[j] * rate)
            per_byte = per_byte + jnp.where(ax_g[j] > 1, term, 0.0)
        return steps.safe_div(frac, per_byte)
    if kind == A2A:
        per_byte = sum(col.torus_all_to_all_time_per_byte(bw[j], ax_g[j], ax_s[j], wrap[j], k) for j in range(3))
        return steps.safe_div(frac, per_byte)
    slow = jnp.inf
    for j in range(3):
        slow = jnp.minimum(slow, jnp.where(ax_g[j] > 1, steps.safe_div(bw[j], ax_s[j]), jnp.inf))
    return jnp.where(jnp.isfinite(slow), slow, 0.0)


# ---------------------------------------------------------------- one call for evaluate

def network(cluster, plan, vols, d_rep, topk, route_node_limit, latency_on, sharpness=None,
            up_efficiency=1.0, out_efficiency=1.0, a2a_efficiency=None, route_groups=0.0, copy_s=0.0, replicas=None,
            a2a_local_peers=0.0):
    """Per-group placement, wire time and bytes per tier on the cluster's topology.

    ``vols``: traffic dicts (bytes, calls, message, steps) for tp, cp, ep, pp, dp (dense
    DP group) and dp_expert. Returns inside (per group), wire_s, up_bytes, out_bytes and
    ``torus_invalid`` (1 where a torus cannot hold the plan in this mapping).
    With the defaults (fat tree, no islands, default order, flat DP, no routing limit)
    this is seed 000's rule: volume / (scale-up or scale-out rate). ``up_efficiency`` and
    ``out_efficiency`` scale the scale-up (and torus link) and scale-out rates to the
    achieved share (nccl-tests bus bandwidth / nominal; seed: 1). ``a2a_efficiency`` =
    (scale-up, scale-out) shares the EP all-to-all achieves on a switched fabric
    (dispatch/combine kernels measured in bulk, calibration.fit.fit_alltoall); None: the
    same as every other group. ``copy_s``: one copy of a collective's per-rank tensor list
    (a traffic dict's ``copies``; Fidelity.rank_copy_us). ``replicas`` (hybrid sharding): ``d_rep`` is a
    shard group's DP ranks, and ``vols["dp_replica"]``, the all-reduce across the replicas of a shard, is
    laid on its own group and counted in DP's wire time and bytes.
    """
    k = sharpness
    raw = cluster
    cluster = raw.replace(
        bw_up_bytes_per_s=raw.bw_up_bytes_per_s * up_efficiency,
        bw_out_bytes_per_s=raw.bw_out_bytes_per_s * out_efficiency,
        torus_bw_x_bytes_per_s=raw.torus_bw_x_bytes_per_s * up_efficiency,
        torus_bw_y_bytes_per_s=raw.torus_bw_y_bytes_per_s * up_efficiency,
        torus_bw_z_bytes_per_s=raw.torus_bw_z_bytes_per_s * up_efficiency)
    a2a_cluster = cluster if a2a_efficiency is None else raw.replace(
        bw_up_bytes_per_s=raw.bw_up_bytes_per_s * a2a_efficiency[0],
        bw_out_bytes_per_s=raw.bw_out_bytes_per_s * a2a_efficiency[1])
    t, c, p = plan.tp, plan.cp, plan.pp
    e = expert_split(plan)[0]                         # the EP share carved from DP (folded: e / (t c))
    inside = placement(t, c, e, p, d_rep, cluster.domain, k, plan.rank_order)
    grp = groups(cluster, plan, d_rep, k, replicas)
    # the all-to-all's own group (groups: folded, the whole TP x CP x e_dp block; else the EP dimension)
    inside["ep"] = jnp.where(plan.ep > 1, group_inside(grp["ep"]["stride"], grp["ep"]["size"], cluster.domain, k), 1.0)
    if replicas is not None:
        r = grp["dp_replica"]
        inside["dp_replica"] = jnp.where(replicas > 1, group_inside(r["stride"], r["size"], cluster.domain, k), 1.0)
    torus = cluster.topology == 2
    no_torus = not maybe_torus(cluster)   # concretely not a torus: its terms are not traced
    if not no_torus:
        _, fill_pos = _axis_prefix(cluster, plan.torus_order)
        grp = {name: dict(g, fill_pos=fill_pos) for name, g in grp.items()}
    by_vol = {"tp": "tp", "cp": "cp", "ep": "ep", "pp": "pp", "dp": "dp_dense", "dp_expert": "dp"}
    if replicas is not None:
        by_vol["dp_replica"] = "dp_replica"
    hier = plan.dp_hierarchical > 0.5
    flat_dp = steps.never(hier)                   # concretely flat DP: the hierarchical terms are not traced
    # a token crosses the scale-out network once a destination node: node-limited routing (DeepSeek-V3
    # sec.3.2.2), or a dispatcher that forwards over NVLink whatever the routing (Plan.ep_node_dedup)
    per_node = (route_node_limit > 0) | (plan.ep_node_dedup >= 1)
    routed = not steps.never(per_node)
    wire, up, out = {}, {}, {}
    for name, gname in by_vol.items():
        vol, g, kind = vols[name], grp[gname], KIND[name]
        out_share, limited, fabric, local = 1.0, None, cluster, 0.0
        if name == "ep":
            if routed:
                limited = per_node & (inside[name] < 0.5)
                limit = jnp.where(route_node_limit > 0, route_node_limit, g["size"])   # no limit: every domain of the group
                out_share = jnp.where(limited, _node_limited_out_share(g, topk, limit, route_groups), 1.0)
            fabric = a2a_cluster
            if not steps.never(a2a_local_peers >= 1):
                # one copy a routed expert (NCCL's all-to-all: grouped send/recv): the peers in the
                # rank's own domain take theirs over NVLink at once, only the rest cross the network
                flat = (a2a_local_peers >= 1) if limited is None else (a2a_local_peers >= 1) & ~limited
                remote = steps.safe_div(g["size"] - g["dom"], g["size"] - 1.0)
                local = jnp.where(flat, 1.0 - remote, 0.0)
                out_share = jnp.where(flat, remote, out_share)
        rate, s_up, s_out = _switched(kind, g, inside[name], fabric, out_share, limited, k, local)
        a = alpha(inside[name], cluster)
        if name in ("dp", "dp_expert") and not flat_dp:   # (hybrid sharding's replica all-reduce: flat)
            h_rate, h_up, h_out = _hierarchical_dp(g, cluster, k)
            rate, s_up, s_out = jnp.where(hier, h_rate, rate), jnp.where(hier, h_up, s_up), jnp.where(hier, h_out, s_out)
            a = jnp.where(hier, _hierarchical_alpha(g, cluster), a)
        if not no_torus:
            rate = jnp.where(torus, _torus(kind, g, cluster, k), rate)
            s_up, s_out = jnp.where(torus, 1.0, s_up), jnp.where(torus, 0.0, s_out)
            a = jnp.where(torus, cluster.alpha_up_s, a)
            inside[name] = jnp.where(torus, jnp.ones_like(inside[name]), inside[name])
        B = vol["bytes"]
        wire[name] = col.wire_time(B, 1.0, vol["steps"], rate, a, latency_on,   # alpha-beta
                                   vol.get("copies", 0.0), copy_s)
        up[name], out[name] = B * s_up, B * s_out
    if replicas is not None:   # the replica all-reduce is DP traffic: its time and bytes count as DP's
        for part in (wire, up, out):
            part["dp"] = part["dp"] + part.pop("dp_replica")
        inside["dp"] = jnp.minimum(inside["dp"], inside.pop("dp_replica"))
        grp = {n: g for n, g in grp.items() if n != "dp_replica"}
    invalid = torus & (False if no_torus else ~torus_mapping_valid(grp, cluster))
    return dict(inside=inside, wire=wire, up_bytes=up, out_bytes=out, torus_invalid=invalid)


# ---------------------------------------------------------------- torus mappings and coordinates

def torus_coords(rank, cluster, plan):
    """(x, y, z) of a global rank: ranks fill the axes in ``plan.torus_order`` (first axis fastest)."""
    return torus_coords_of(rank, _torus_sizes(cluster), plan.torus_order)


@host_when_concrete   # a rank's coordinates (rankmap, launch): numpy, nothing compiled
def torus_coords_of(rank, sizes, torus_order=0.0):
    """(x, y, z) of a global rank on a torus of ``sizes`` (x, y, z), filled in ``torus_order``."""
    n = [jnp.asarray(x, dtype=jnp.result_type(float)) for x in sizes]
    prefix = _inner_products(n, _positions(torus_order, _TORUS_POS))
    r = jnp.asarray(rank, dtype=jnp.result_type(float))
    return tuple(jnp.mod(jnp.floor(r / prefix[j]), n[j]) for j in range(len(AXES)))


def _axis_label(g, s, n):
    parts = []
    for j, ax in enumerate(AXES):
        gj, sj, nj = int(round(g[j])), int(round(s[j])), int(round(n[j]))
        if gj > 1:
            parts.append(ax if gj == nj else f"{ax}{gj}" + (f"/{sj}" if sj > 1 else ""))
    return "*".join(parts) or "-"


@host_when_concrete   # a host-side list from concrete inputs: numpy, nothing compiled
def torus_mappings(cluster, plan) -> list[dict]:
    """Every distinct valid mapping of one plan onto the cluster's torus (a sweep axis).

    Tries each rank order x fill order (RANK_ORDERS x TORUS_ORDERS, 720 pairs) at once and
    keeps those where every group splits exactly onto axes, one per distinct placement of
    the dimensions. Each entry: ``rank_order`` and ``torus_order`` codes for Plan, and
    ``axes``: which axes each dimension of size > 1 occupies ("x" whole axis, "x2" two of
    its chips, "x2/2" two chips two links apart). Use ``mapping_axes`` to sweep them.
    """
    ro = np.repeat(np.arange(len(RANK_ORDERS)), len(TORUS_ORDERS)).astype(float)
    to = np.tile(np.arange(len(TORUS_ORDERS)), len(RANK_ORDERS)).astype(float)
    one = lambda x: float(np.asarray(x).reshape(-1)[0])  # noqa: E731
    pl = plan.replace(rank_order=ro, torus_order=to)
    _, d_rep, _ = derived(cluster, pl)
    grp = groups(cluster, pl, d_rep)
    valid = np.broadcast_to(np.asarray(torus_mapping_valid(grp, cluster)), ro.shape)
    n = [one(x) for x in _torus_sizes(cluster)]
    flat = lambda x: np.broadcast_to(np.asarray(x), ro.shape)  # noqa: E731
    seen, out = set(), []
    for i in np.flatnonzero(valid):
        axes = {}
        for name in DIMS:
            g = grp[name]
            if one(g["size"]) > 1:
                axes[name] = _axis_label([flat(x)[i] for x in g["ax_g"]], [flat(x)[i] for x in g["ax_s"]], n)
        key = tuple(sorted(axes.items()))
        if key in seen:
            continue
        seen.add(key)
        out.append({"rank_order": int(ro[i]), "torus_order": int(to[i]), "axes": axes})
    return out


def mapping_axes(mappings):
    """(rank_order, torus_order) arrays for a list of mappings, to zip into one sweep axis."""
    return (jnp.asarray([m["rank_order"] for m in mappings], dtype=jnp.result_type(float)),
            jnp.asarray([m["torus_order"] for m in mappings], dtype=jnp.result_type(float)))
