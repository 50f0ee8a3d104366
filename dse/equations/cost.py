"""Network cost and power: what the scale-up and scale-out bandwidths cost, by part.

Fat trees. A non-blocking folded-Clos fat tree of N endpoints built from radix-R switches
needs L = 1 tier up to R endpoints, 2 up to R^2/2, 3 up to R^3/4 (Al-Fares et al. 2008,
sec.2; Leiserson 1985). Every tier below the top has N ports down and N up, the top N down,
so 2L-1 ports an endpoint; oversubscription o:1 at the leaves divides every port and link
above them by o. Links between switches carry a transceiver at each end. A three-tier
cluster is islands of I endpoints (non-blocking fat trees) whose N/o uplinks meet in a core
fat tree (seed 001). Rail-only: U rails, each a fat tree of the N/U same-rank GPUs, no spine
(Rail-only, Wang et al. 2023, sec.3). A torus has no switches: N links an axis with
wraparound, N - N/n without.

Bandwidth. Scale-up: an accelerator's bw_up is ceil(bw_up / link rate) links of one NVLink
generation, one switch plane a link (H100 whitepaper: 18 links, 18 NVSwitch planes in
a DGX H100); each plane is a fat tree of the domain's U accelerators of that generation's
NVSwitch radix, copper inside a rack and optical between switches beyond it. Scale-out:
ceil(bw_out / NIC rate) NICs of one rate (100-800 Gb/s), each on its own plane of the
cluster's fabric built from that rate's switches (multi-plane / rail-optimized), with
short-reach optics to the leaves and inside islands, single-mode optics to a core or a
third tier. A torus link of bw GB/s is ceil(bw / lane rate) lanes. Of the generations (rates)
that serve the domain and the bandwidth, the cheapest is priced: an argmin when exact; with a
``sharpness`` k the weights are softmax(-k log cost) (a smooth argmin in log dollars),
the ceilings and tier counts smooth through dse/equations/steps.py, so the cost is
differentiable in bandwidth, domain size, island size and oversubscription and exact when
snapped. Parameters, with sources and dates: dse/data/network_cost.toml.
"""

from __future__ import annotations

import functools
import tomllib
from importlib import resources

import numpy as np

from dse.backend import host_when_concrete, jnp
from dse.equations import steps

__all__ = ["params", "fat_tree_tiers", "fat_tree", "network_cost", "network_parts", "part_costs",
           "scale_up_option", "PRICED", "SCALE_OUT_PARTS", "SCALE_UP_PARTS"]

PRICED = ("nics", "out_switches", "transceivers", "up_switches", "up_links", "torus_links")
SCALE_OUT_PARTS = ("nics", "out_switches", "transceivers")
SCALE_UP_PARTS = ("up_switches", "up_links")
_META = ("description", "source", "date")


@functools.cache
def params() -> dict:
    """The data file as {"scale_up": {gen: {...}}, "scale_out": {rate: {...}}, "torus": {...}} (floats)."""
    raw = tomllib.loads((resources.files("dse") / "data" / "network_cost.toml").read_text())
    num = lambda t: {k: float(v) for k, v in t.items() if k not in _META}  # noqa: E731
    return {"scale_up": {g: num(t) for g, t in raw["scale_up"].items()},
            "scale_out": {r: num(t) for r, t in raw["scale_out"].items()},
            "torus": num(raw["torus"])}


def fat_tree_tiers(n, radix, sharpness=None):
    """Tiers of a non-blocking fat tree: 1 to R, 2 to R^2/2, 3 to R^3/4, 4 beyond (Al-Fares'08 sec.2)."""
    k = sharpness
    return (4.0 - steps.le(n, radix, k) - steps.le(n, radix ** 2 / 2.0, k)
            - steps.le(n, radix ** 3 / 4.0, k))


def fat_tree(n, radix, oversub=1.0, sharpness=None):
    """Switches, switch ports and switch-to-switch links of a fat tree of ``n`` endpoints.

    Ports: n at the leaves plus 2 n/o for every tier above (up at one tier, down at the
    next); switches = ports / R (at least one); links between switches (L-1) n/o, of which
    (L-2) n/o above the second tier (``far_links``, single-mode reach).
    """
    tiers = fat_tree_tiers(n, radix, sharpness)
    ports = n + 2.0 * n / oversub * (tiers - 1.0)                         # Al-Fares'08: (2L-1) n ports
    switches = steps.maximum(ports / radix, jnp.where(n > 0, 1.0, 0.0), sharpness)
    links = (tiers - 1.0) * n / oversub
    far = steps.relu(tiers - 2.0, sharpness) * n / oversub
    return dict(tiers=tiers, ports=ports, switches=switches, links=links, far_links=far)


def _scale_out_plane(cluster, radix, k):
    """Switches and switch-to-switch links (near: short reach; far: single-mode) of one plane
    joining the cluster's N accelerators, by topology (inputs.TOPOLOGIES)."""
    N, U, o = cluster.gpus, cluster.domain, cluster.oversubscription
    two = fat_tree(N, radix, 1.0, k)                                       # seed: one non-blocking fabric
    I = jnp.where(cluster.island_gpus > 0, cluster.island_gpus, N)
    isl = fat_tree(I, radix, 1.0, k)
    core = fat_tree(N / o, radix, 1.0, k)
    # three tiers: islands (short reach inside), their N/o uplinks and the core fat tree (single-mode)
    three_sw = N / I * isl["switches"] + core["switches"] + N / o / radix   # island tops' uplink ports
    three_near, three_far = N / I * isl["links"], N / o + core["links"]
    split = jnp.where(cluster.island_gpus > 0, 1.0, 0.0) * jnp.where(cluster.island_gpus < N, 1.0, 0.0)
    rail = fat_tree(N / U, radix, 1.0, k)
    topo = cluster.topology
    pick = lambda rail_v, three_v, two_v: jnp.where(  # noqa: E731
        topo == 1, rail_v, jnp.where(topo == 2, 0.0, steps.where(split, three_v, two_v)))
    switches = pick(U * rail["switches"], three_sw, two["switches"])
    near = pick(U * (rail["links"] - rail["far_links"]), three_near, two["links"] - two["far_links"])
    far = pick(U * rail["far_links"], three_far, two["far_links"])
    return switches, near, far


def _stacked(table: dict, *inputs) -> dict:
    """A section of ``params()`` (one table an option) as arrays over a leading option axis, in the
    inputs' float dtype and broadcast against them: every option is priced by one set of equations
    (four NIC rates or NVLink generations were four copies of the same equations in a program)."""
    rows = list(table.values())
    rank = max((np.ndim(x) for x in inputs), default=0)
    dtype = jnp.result_type(*inputs)
    dtype = dtype if np.issubdtype(dtype, np.floating) else jnp.result_type(float)
    return {key: np.reshape(np.array([r[key] for r in rows], dtype), (len(rows),) + (1,) * rank) for key in rows[0]}


def _options(costs, allowed, k):
    """Weights over the leading option axis: argmin of cost among the allowed (exact),
    softmax(-k log cost) smooth."""
    logc, ok = jnp.broadcast_arrays(jnp.log(jnp.maximum(costs, 1e-9)), allowed)
    n = logc.shape[0]
    if k is None:   # the first least cost among the allowed (argmin), as a chain of compares
        score = jnp.where(ok > 0, logc, jnp.inf)
        best, low = 0, score[0]
        for i in range(1, n):
            best, low = jnp.where(score[i] < low, i, best), jnp.minimum(score[i], low)
        return [jnp.where(best == i, 1.0, 0.0).astype(logc.dtype) for i in range(n)]
    score = -k * logc + jnp.log(jnp.maximum(ok, 1e-300))
    w = jnp.exp(score - jnp.max(score, axis=0, keepdims=True))
    w = w / jnp.sum(w, axis=0, keepdims=True)
    return [w[i] for i in range(n)]


def _blend(weights: list, parts: dict, keys=None) -> dict:
    """Each part (of ``keys``, a tuple of name prefixes; None: all) weighted over the options (slices
    of the option axis: a sum over that axis is a reduction XLA does not fuse into the sweep's
    elementwise loop)."""
    return {key: sum(w * v[i] for i, w in enumerate(weights)) for key, v in parts.items()
            if keys is None or key.startswith(keys)}


def _scale_out(cluster, k, keys=None):
    """{part: count}, {part: USD}, {part: W} of the scale-out network, the cheapest NIC rate."""
    N = cluster.gpus
    t = _stacked(params()["scale_out"], N, cluster.domain, cluster.oversubscription, cluster.island_gpus,
                 cluster.topology, cluster.bw_out_bytes_per_s)
    on = jnp.where(cluster.topology == 2, 0.0, 1.0)
    # NICs per GPU: at least one (a cluster without scale-out bandwidth is not priced here)
    planes = steps.maximum(steps.ceil(cluster.bw_out_bytes_per_s / (t["GBps"] * 1e9) - 1e-9, k), 1.0, k)
    sw, near, far = _scale_out_plane(cluster, t["switch_radix"], k)
    nics = on * planes * N
    sr, dr = 2.0 * on * planes * (N + near), 2.0 * on * planes * far                # both ends of a link
    opt = dict(nics=nics, out_switches=on * planes * sw, transceivers=sr + dr,
               usd_nics=nics * t["nic_usd"], usd_out_switches=on * planes * sw * t["switch_usd"],
               usd_transceivers=sr * t["optic_sr_usd"] + dr * t["optic_dr_usd"],
               w_nics=nics * t["nic_w"], w_out_switches=on * planes * sw * t["switch_w"],
               w_transceivers=sr * t["optic_sr_w"] + dr * t["optic_dr_w"])
    cost = opt["usd_nics"] + opt["usd_out_switches"] + opt["usd_transceivers"]
    return _blend(_options(cost, 1.0, k), opt, keys)


def scale_up_option(cluster, g: dict, k=None) -> dict:
    """Counts, USD and W of the scale-up network built from one NVLink generation ``g``
    (a table of dse/data/network_cost.toml's scale_up)."""
    N, U = cluster.gpus, cluster.domain
    on = jnp.where(cluster.topology == 2, 0.0, 1.0) * jnp.where(U > 1, 1.0, 0.0)
    planes = steps.maximum(steps.ceil(cluster.bw_up_bytes_per_s / (g["link_GBps"] * 1e9) - 1e-9, k), 1.0, k)
    tree = fat_tree(U, g["switch_radix"], 1.0, k)
    domains = N / U
    sw = on * domains * planes * tree["ports"] / g["switch_radix"]
    copper = on * domains * planes * U                                       # accelerator to switch
    # switch-to-switch links: copper inside a rack, optical beyond it
    optical = on * domains * planes * tree["links"] * (1.0 - steps.le(U, g["rack_gpus"], k))
    inner = on * domains * planes * tree["links"] - optical
    return dict(up_switches=sw, up_links=copper + inner + optical, links_per_gpu=planes,
                usd_up_switches=sw * g["switch_usd"],
                usd_up_links=(copper + inner) * g["link_usd"] + 2.0 * optical * g["optic_usd"],
                w_up_switches=sw * g["switch_w"],
                w_up_links=(copper + inner) * g["link_w"] + 2.0 * optical * g["optic_w"])


def _scale_up(cluster, k, keys=None):
    """The scale-up network's parts, the cheapest NVLink generation that serves domain and bandwidth."""
    table = params()["scale_up"]
    g = _stacked(table, cluster.gpus, cluster.domain, cluster.topology, cluster.bw_up_bytes_per_s)
    opt = scale_up_option(cluster, g, k)
    cost = opt["usd_up_switches"] + opt["usd_up_links"] + 1.0
    # the newest generation prices what no generation serves
    newest = (np.arange(len(table)) == len(table) - 1).reshape(g["links"].shape)
    allowed = jnp.where(newest, 1.0, steps.le(cluster.domain, g["max_domain"], k)
                        * steps.le(opt["links_per_gpu"], g["links"] + 0.5, k))
    return _blend(_options(cost, allowed, k), opt, keys)


def _torus(cluster, k):
    """Torus lanes along every axis in use (wraparound closes each ring)."""
    N, t = cluster.gpus, params()["torus"]
    links = lanes = 0.0
    for n_ax, bw in ((cluster.torus_x, cluster.torus_bw_x_bytes_per_s), (cluster.torus_y, cluster.torus_bw_y_bytes_per_s),
                     (cluster.torus_z, cluster.torus_bw_z_bytes_per_s)):
        per_axis = jnp.where(n_ax > 1, jnp.where(cluster.torus_wrap > 0.5, N, N - steps.safe_div(N, n_ax)), 0.0)
        links = links + per_axis
        lanes = lanes + per_axis * steps.maximum(steps.ceil(bw / (t["lane_GBps"] * 1e9) - 1e-9, k), 1.0, k)
    on = jnp.where(cluster.topology == 2, 1.0, 0.0)
    return dict(torus_links=on * links, usd_torus_links=on * lanes * t["lane_usd"],
                w_torus_links=on * lanes * t["lane_w"])


def _all(cluster, sharpness=None, keys=None) -> dict:
    return {**_scale_out(cluster, sharpness, keys), **_scale_up(cluster, sharpness, keys), **_torus(cluster, sharpness)}


@host_when_concrete   # concrete inputs (a notebook's curve, a report): numpy, nothing compiled
def network_parts(cluster, sharpness=None) -> dict:
    """Counts of NICs, switches, optics and links for the cluster's topology and bandwidths."""
    a = _all(cluster, sharpness)
    return {p: a[p] for p in PRICED}


@host_when_concrete
def part_costs(cluster, sharpness=None) -> dict:
    """{part: (USD, W)} for every priced part of the network."""
    a = _all(cluster, sharpness)
    return {p: (a[f"usd_{p}"], a[f"w_{p}"]) for p in PRICED}


# In a relaxation (a sharpness given: the co-design's optimizer) the network cost's staircase (whole
# links and NICs) is smoothed at no more than this sharpness: a ramp between whole links, so a
# budget-bound optimum settles on a smooth boundary instead of creeping along flat treads; snapping
# prices it exactly.
RELAXED_SHARPNESS = 8.0


def relaxed_sharpness(sharpness):
    """The sharpness a relaxed network cost is smoothed at: ``sharpness`` up to RELAXED_SHARPNESS;
    None (exact) stays None."""
    return None if sharpness is None else jnp.minimum(sharpness, RELAXED_SHARPNESS)


def _totals(cluster, sharpness, parts, kinds):
    """Sum over ``parts`` of each kind of figure ("usd", "w"), the others neither blended nor traced."""
    a = _all(cluster, sharpness, tuple(f"{kind}_" for kind in kinds))
    return tuple(sum(a[f"{kind}_{p}"] for p in parts) for kind in kinds)


@host_when_concrete
def network_usd(cluster, sharpness=None):
    """The network's USD alone (``network_cost``'s first figure, the same sum): neither its power nor
    its part counts are worked out, for a caller that prices hardware (co-design's objective and budget)."""
    return _totals(cluster, sharpness, PRICED, ("usd",))[0]


@host_when_concrete
def network_cost(cluster, sharpness=None, parts=None):
    """(USD, W) of the network: NICs, switches, optics, scale-up switches and links, torus links.

    ``parts``: a subset of PRICED (e.g. SCALE_OUT_PARTS); all by default.
    """
    return _totals(cluster, sharpness, parts or PRICED, ("usd", "w"))
