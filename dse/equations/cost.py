"""Network cost and power: scale-up domains, NICs, fat trees, islands, rails, torus links.

A non-blocking folded-Clos fat tree of N endpoints built from radix-R switches needs
L = 1 tier up to R endpoints, 2 up to R^2/2, 3 up to R^3/4 (Al-Fares et al. 2008, sec.2;
Leiserson 1985). Every tier below the top has N ports down and N up, the top N down,
so 2L-1 ports an endpoint; oversubscription o:1 at the leaves divides every port and
link above them by o. Links between switches carry a transceiver at each end. A
three-tier cluster is islands of I endpoints (non-blocking fat trees) whose N/o
uplinks meet in a core fat tree (seed 001). Rail-only: U rails, each a fat tree of the
N/U same-rank GPUs, no spine (Rail-only, Wang et al. 2023, sec.3). A torus has no
switches: N links an axis with wraparound, N - N/n without. Parameters: data file
dse/data/network_cost.toml, with sources.
"""

from __future__ import annotations

import functools
import tomllib
from importlib import resources

import jax.numpy as jnp

from dse.equations import steps

__all__ = ["params", "fat_tree_tiers", "fat_tree", "network_cost", "network_parts", "part_costs",
           "PRICED", "SCALE_OUT_PARTS"]


@functools.cache
def params() -> dict:
    """Cost and power parameters from dse/data/network_cost.toml (USD, W, ports)."""
    raw = tomllib.loads((resources.files("dse") / "data" / "network_cost.toml").read_text())
    return {k: float(v) for k, v in raw.items() if k not in ("description", "source")}


def fat_tree_tiers(n, radix, sharpness=None):
    """Tiers of a non-blocking fat tree: 1 to R, 2 to R^2/2, 3 to R^3/4, 4 beyond (Al-Fares'08 sec.2)."""
    k = sharpness
    return (4.0 - steps.le(n, radix, k) - steps.le(n, radix ** 2 / 2.0, k)
            - steps.le(n, radix ** 3 / 4.0, k))


def fat_tree(n, radix, oversub=1.0, sharpness=None):
    """Switches, switch ports and switch-to-switch links of a fat tree of ``n`` endpoints.

    Ports: n at the leaves plus 2 n/o for every tier above (up at one tier, down at the
    next); switches = ports / R (at least one); links between switches (L-1) n/o.
    """
    tiers = fat_tree_tiers(n, radix, sharpness)
    ports = n + 2.0 * n / oversub * (tiers - 1.0)                         # Al-Fares'08: (2L-1) n ports
    switches = steps.maximum(ports / radix, jnp.where(n > 0, 1.0, 0.0), sharpness)
    links = (tiers - 1.0) * n / oversub
    return dict(tiers=tiers, ports=ports, switches=switches, links=links)


def network_parts(cluster, sharpness=None) -> dict:
    """Counts of switches, NICs, optics and links for the cluster's topology."""
    k = sharpness
    P = params()
    N, U = cluster.gpus, cluster.domain
    o = cluster.oversubscription
    R = P["out_switch_radix"]
    # Scale-up: up_links_per_gpu planes of a fat tree over the U GPUs of each domain.
    up = fat_tree(U, P["up_switch_radix"], 1.0, k)
    domains = N / U
    has_up = jnp.where(U > 1, 1.0, 0.0)
    up_switches = has_up * domains * P["up_links_per_gpu"] * up["ports"] / P["up_switch_radix"]
    up_links = has_up * domains * P["up_links_per_gpu"] * (U + up["links"])
    # Scale-out, by topology (inputs.TOPOLOGIES).
    two = fat_tree(N, R, 1.0, k)                                           # seed: one non-blocking fabric
    I = jnp.where(cluster.island_gpus > 0, cluster.island_gpus, N)
    isl = fat_tree(I, R, 1.0, k)
    core = fat_tree(N / o, R, 1.0, k)
    three = dict(switches=N / I * isl["switches"] + core["switches"] + N / o / R,   # island tops' uplink ports
                 links=N / I * isl["links"] + N / o + core["links"])
    split = jnp.where(cluster.island_gpus > 0, 1.0, 0.0) * jnp.where(cluster.island_gpus < N, 1.0, 0.0)
    ft_sw = steps.where(split, three["switches"], two["switches"])
    ft_links = steps.where(split, three["links"], two["links"])
    rail = fat_tree(N / U, R, 1.0, k)
    rail_sw, rail_links = U * rail["switches"], U * rail["links"]
    topo = cluster.topology
    out_sw = jnp.where(topo == 1, rail_sw, jnp.where(topo == 2, 0.0, ft_sw))
    inter = jnp.where(topo == 1, rail_links, jnp.where(topo == 2, 0.0, ft_links))
    nics = jnp.where(topo == 2, 0.0, N)
    transceivers = 2.0 * (nics + inter)                                    # NIC-leaf and switch-switch links, both ends
    # Torus: links along every axis in use; wraparound closes each ring.
    torus_links = 0.0
    for n_ax in (cluster.torus_x, cluster.torus_y, cluster.torus_z):
        per_axis = jnp.where(cluster.torus_wrap > 0.5, N, N - steps.safe_div(N, n_ax))
        torus_links = torus_links + jnp.where(n_ax > 1, per_axis, 0.0)
    torus_links = jnp.where(topo == 2, torus_links, 0.0)
    up_switches = jnp.where(topo == 2, 0.0, up_switches)
    up_links = jnp.where(topo == 2, 0.0, up_links)
    return dict(nics=nics, out_switches=out_sw, transceivers=transceivers, up_switches=up_switches,
                up_links=up_links, torus_links=torus_links)


PRICED = {"nics": "nic", "out_switches": "out_switch", "transceivers": "transceiver",
          "up_switches": "up_switch", "up_links": "up_link", "torus_links": "torus_link"}
SCALE_OUT_PARTS = ("nics", "out_switches", "transceivers")


def part_costs(cluster, sharpness=None) -> dict:
    """{part: (USD, W)} for every priced part of the network (counts x data-file prices)."""
    P = params()
    n = network_parts(cluster, sharpness)
    return {part: (n[part] * P[f"{key}_usd"], n[part] * P[f"{key}_w"]) for part, key in PRICED.items()}


def network_cost(cluster, sharpness=None, parts=None):
    """(USD, W) of the network: NICs, switches, optics, scale-up switches and links, torus links.

    ``parts``: a subset of PRICED's keys (e.g. SCALE_OUT_PARTS); all by default.
    """
    costs = part_costs(cluster, sharpness)
    keys = parts or tuple(PRICED)
    return sum(costs[p][0] for p in keys), sum(costs[p][1] for p in keys)
