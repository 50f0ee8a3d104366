"""Rank maps: global rank -> node, local rank and parallel coordinates.

Frameworks number ranks by the plan's dimensions, innermost first; dse's default is
[TP, CP, EP, PP, DP'] (seed 000 "Rank layout"), so with TP 8,
PP 4, DP 32 ranks 0-7 form one TP group, ranks 8 apart are pipeline neighbours and
ranks 256 apart data-parallel peers (seed 001, "Rank ordering is the placement").
Launchers put ``gpus_per_node`` consecutive ranks on each node ("block"), or, when a
scheduler interleaves pods, deal them out round-robin, which is how a TP group ends
up spanning nodes without any configuration change (seed 001, "Failure Modes").

The strides come from ``dse.equations.topology.strides`` (any order, ``Plan.rank_order``), so the
rank map and the model's inside-the-domain rule share one arithmetic; on a torus each
rank also gets its (x, y, z) from ``dse.equations.topology.torus_coords_of``. ``dp`` here is the
coordinate outside EP (d' = d/e); with e = 1 it is the data-parallel index.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from dse.backend import host_when_concrete
from dse.equations import topology
from dse.errors import InputError
from dse.ops.verdict import FAIL, PASS

__all__ = ["DEFAULT_ORDER", "ASSIGNMENTS", "RankMap", "rank_map", "format_line", "format_ranks", "tp_check"]

DEFAULT_ORDER = tuple(topology.DIMS)      # ("tp", "cp", "ep", "pp", "dp"), innermost first
ASSIGNMENTS = ("block", "round-robin")


@host_when_concrete   # whole numbers on the host: numpy, no eager XLA op where jax is imported
def _strides(sizes: dict, order: tuple) -> dict:
    """Rank stride of each dimension for ``order`` (innermost first): ``dse.equations.topology.strides``."""
    st = topology.strides(*(np.float64(sizes[k]) for k in DEFAULT_ORDER),
                          order=float(topology.rank_order_code(list(order))))
    return {k: int(round(float(v))) for k, v in st.items()}


@dataclasses.dataclass(frozen=True)
class RankMap:
    """Where every rank of a plan sits. All methods take and return Python/NumPy ints."""

    sizes: dict                  # {"tp": t, "cp": c, "ep": e, "pp": p, "dp": d'}
    gpus_per_node: int
    order: tuple = DEFAULT_ORDER
    assignment: str = "block"    # rank -> node: "block" (consecutive) or "round-robin"
    node_prefix: str = "node-"
    first_node: int = 0
    node_digits: int = 0
    torus: tuple = ()            # (x, y, z) axis sizes on a torus cluster; () otherwise
    torus_order: int = 0         # index into topology.TORUS_ORDERS: the order ranks fill the axes

    @property
    def world(self) -> int:
        return int(np.prod([self.sizes[k] for k in self.order]))

    @property
    def nodes(self) -> int:
        return -(-self.world // self.gpus_per_node)

    @functools.cached_property
    def strides(self) -> dict:   # once a map: coords() and groups() read it for every rank
        return _strides(self.sizes, self.order)

    def coords(self, ranks) -> dict:
        """Coordinate of each rank on each dimension: (r // stride) % size."""
        r = np.asarray(ranks, dtype=np.int64)
        st = self.strides
        return {k: (r // st[k]) % self.sizes[k] for k in DEFAULT_ORDER}

    def rank_of(self, **coords) -> np.ndarray:
        """Global rank from coordinates (missing ones are 0)."""
        st = self.strides
        return sum(np.asarray(coords.get(k, 0), dtype=np.int64) * st[k] for k in DEFAULT_ORDER)

    def node_index(self, ranks) -> np.ndarray:
        r = np.asarray(ranks, dtype=np.int64)
        if self.assignment == "block":
            return r // self.gpus_per_node
        return r % self.nodes

    def local_rank(self, ranks) -> np.ndarray:
        r = np.asarray(ranks, dtype=np.int64)
        if self.assignment == "block":
            return r % self.gpus_per_node
        return r // self.nodes

    def node_name(self, index: int) -> str:
        i = int(index) + self.first_node
        return f"{self.node_prefix}{i:0{self.node_digits}d}" if self.node_digits else f"{self.node_prefix}{i}"

    def groups(self, dim: str) -> np.ndarray:
        """Every group of ``dim``: array [groups, size] of global ranks, members in coordinate order."""
        if dim not in DEFAULT_ORDER:
            raise InputError(f"dimension: unknown {dim!r}; allowed: {', '.join(DEFAULT_ORDER)}")
        size, stride = self.sizes[dim], self.strides[dim]
        ranks = np.arange(self.world, dtype=np.int64)
        leaders = ranks[self.coords(ranks)[dim] == 0]
        return leaders[:, None] + stride * np.arange(size, dtype=np.int64)[None, :]

    def group_of(self, rank: int, dim: str) -> np.ndarray:
        c = self.coords(rank)
        base = int(rank) - int(c[dim]) * self.strides[dim]
        return base + self.strides[dim] * np.arange(self.sizes[dim], dtype=np.int64)

    def groups_spanning_nodes(self, dim: str) -> np.ndarray:
        """Groups of ``dim`` whose members sit on more than one node: [k, size] ranks."""
        g = self.groups(dim)
        nodes = self.node_index(g)
        return g[(nodes != nodes[:, :1]).any(axis=1)]

    def same_group(self, a, b, dim: str) -> np.ndarray:
        """True where ranks a and b differ only in ``dim`` (and are distinct)."""
        ca, cb = self.coords(a), self.coords(b)
        same_rest = np.ones(np.broadcast_shapes(np.shape(a), np.shape(b)), dtype=bool)
        for k in DEFAULT_ORDER:
            if k != dim:
                same_rest &= ca[k] == cb[k]
        return same_rest & (ca[dim] != cb[dim])

    def entry(self, rank: int) -> dict:
        """One rank's record: global, node, node_index, local and coordinates."""
        if not 0 <= int(rank) < self.world:
            raise InputError(f"--ranks: {rank} is outside the job; allowed: 0..{self.world - 1}")
        c = self.coords(rank)
        n = int(self.node_index(rank))
        out = {"global": int(rank), "node": self.node_name(n), "node_index": n,
               "local": int(self.local_rank(rank)), **{k: int(v) for k, v in c.items()}}
        if self.torus:
            out["torus"] = [int(x) for x in topology.torus_coords_of(rank, self.torus, float(self.torus_order))]
        return out


def rank_map(tp=1, cp=1, ep=1, pp=1, dp=1, gpus_per_node=8, order=DEFAULT_ORDER, assignment="block",
             node_prefix="node-", first_node=0, node_digits=0, torus=(), torus_order=0) -> RankMap:
    """A RankMap for integer degrees; ``dp`` is d' = d/e (the replicas outside EP)."""
    sizes = {"tp": tp, "cp": cp, "ep": ep, "pp": pp, "dp": dp}
    for k, v in sizes.items():
        if int(v) != v or v < 1:
            raise InputError(f"rank map: {k} = {v!r} is not allowed; allowed: an integer >= 1")
    sizes = {k: int(v) for k, v in sizes.items()}
    order = tuple(order)
    if sorted(order) != sorted(DEFAULT_ORDER):
        raise InputError(f"--rank-order: {','.join(order)!r} is not a permutation of {','.join(DEFAULT_ORDER)}")
    if assignment not in ASSIGNMENTS:
        raise InputError(f"--assign: unknown {assignment!r}; allowed: {', '.join(ASSIGNMENTS)}")
    if int(gpus_per_node) != gpus_per_node or gpus_per_node < 1:
        raise InputError(f"--gpus-per-node: {gpus_per_node!r} is not allowed; allowed: an integer >= 1")
    rm = RankMap(sizes, int(gpus_per_node), order, assignment, node_prefix, int(first_node), int(node_digits),
                 tuple(int(x) for x in torus), int(torus_order))
    if rm.world % rm.gpus_per_node:
        raise InputError(f"rank map: {rm.world} ranks do not fill nodes of {rm.gpus_per_node}; "
                         f"allowed: a multiple of gpus per node")
    return rm


def format_line(entry: dict, rm: RankMap) -> str:
    """Seed 001's startup line: ``rank map: global=8   node=gpu-node-0418 local=0  tp=0 pp=1 dp=0``.

    tp, pp and dp always; cp and ep when their degree is above 1; torus=(x,y,z) on a torus.
    Field widths are the seed's (``%-3d`` for global, ``%-2d`` for local); wider numbers
    just push the line.
    """
    dims = [k for k in DEFAULT_ORDER if k in ("tp", "pp", "dp") or rm.sizes[k] > 1]
    coords = " ".join(f"{k}={entry[k]}" for k in dims)
    if "torus" in entry:
        coords += " torus=(" + ",".join(str(x) for x in entry["torus"]) + ")"
    return (f"rank map: global={entry['global']:<3} node={entry['node']} "
            f"local={entry['local']:<2} {coords}")


def format_ranks(group) -> str:
    """'0-7' for consecutive ranks, else the first eight comma-separated."""
    g = [int(x) for x in group]
    if len(g) > 2 and all(b - a == 1 for a, b in zip(g, g[1:])):
        return f"{g[0]}-{g[-1]}"
    return ",".join(map(str, g[:8])) + (",..." if len(g) > 8 else "")


def tp_check(rm: RankMap):
    """(status, message, offending groups) for 'every TP group shares one node' (seed 001)."""
    bad = rm.groups_spanning_nodes("tp")
    if rm.sizes["tp"] > rm.gpus_per_node:
        why = f"TP {rm.sizes['tp']} is above {rm.gpus_per_node} GPUs per node"
    else:
        why = f"rank order {','.join(rm.order)}, {rm.assignment} assignment"
    if len(bad) == 0:
        return PASS, f"every TP group of {rm.sizes['tp']} shares one node ({len(rm.groups('tp'))} groups)", bad
    g = bad[0]
    nodes = [rm.node_name(n) for n in sorted({int(n) for n in rm.node_index(g)})]
    msg = (f"TP group {format_ranks(g)} spans nodes {', '.join(nodes[:4])}{' ...' if len(nodes) > 4 else ''}"
           f" ({len(bad)} of {len(rm.groups('tp'))} TP groups span nodes; {why})")
    return FAIL, msg, bad
