"""Helpers shared by the operator commands (check, nccl-tests, nccl-log, launch, suggest, rankmap)."""

from __future__ import annotations

from dse.equations import topology
from dse.equations.degrees import rank_dims
from dse.cli import common
from dse.inputs import checks
from dse.errors import InputError
from dse.inputs import TOPOLOGIES
from dse.ops import rankmap


def add_rankmap_args(p):
    """Node naming and the launcher's rank -> node assignment (the rank order is --rank-order)."""
    g = p.add_argument_group("rank map")
    g.add_argument("--assign", default="block", help="rank -> node: block (consecutive ranks per node, default) "
                                                     "or round-robin (a scheduler that interleaves pods)")
    g.add_argument("--node-prefix", default="node-", help="node name prefix (default node-)")
    g.add_argument("--first-node", default="0", help="number of the first node (default 0)")
    g.add_argument("--node-digits", default="0", help="zero-pad node numbers to this width (default 0: none)")


def rankmap_from_args(args, cluster) -> rankmap.RankMap:
    """The rank map of the plan flags (checked by common.plan_from_args) on the cluster."""
    plan = common.plan_from_args(args, None, cluster)
    checks.number("--gpus", float(cluster.gpus), integer=True, maximum=checks.MAX_RANKS)   # a rank map lists every rank
    gpn = checks.number("--gpus-per-node", float(cluster.gpus_per_node), integer=True)
    torus = {}
    if float(cluster.topology) == TOPOLOGIES["torus"]:       # torus coordinates of each rank
        torus = {"torus": tuple(int(float(n)) for n in (cluster.torus_x, cluster.torus_y, cluster.torus_z)),
                 "torus_order": int(float(plan.torus_order))}
    return rankmap.rank_map(**rank_dims(cluster, plan),       # the rank order's dimensions (folded: e / (t c))
                            gpus_per_node=int(gpn), order=topology.rank_order_names(plan.rank_order), **torus,
                            assignment=args.assign, node_prefix=args.node_prefix,
                            first_node=int(checks.number("--first-node", args.first_node, integer=True, minimum=0)),
                            node_digits=int(checks.number("--node-digits", args.node_digits, integer=True, minimum=0)))


def parse_int_list(flag: str, text: str, limit: int | None = None) -> list[int]:
    out = []
    for tok in str(text).split(","):
        tok = tok.strip()
        if not tok:
            continue
        if "-" in tok[1:]:
            a, b = tok.split("-", 1)
            lo, hi = checks.int_range(flag, a, b, int(limit) if limit is not None else 2 ** 53)  # before expanding
            out.extend(range(lo, hi + 1))
        else:
            out.append(int(checks.number(flag, tok, integer=True, minimum=0)))
            if limit is not None and out[-1] >= limit:
                raise InputError(f"{flag}: {out[-1]} is not allowed; allowed: ranks 0..{int(limit) - 1}")
    if not out:
        raise InputError(f"{flag}: {text!r} names no rank; allowed: a comma list like 0,7,8 or ranges like 0-15")
    return out


EXIT_HELP = "exit status: 0 all PASS, 1 worst is WARN, 3 a FAIL, 2 bad input"
__all__ = ["add_rankmap_args", "rankmap_from_args", "parse_int_list", "EXIT_HELP"]

