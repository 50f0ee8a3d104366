"""``dse rankmap``: each global rank's node, local rank and coordinates (seed 001 'rank map:' lines)."""

from __future__ import annotations


from dse import files
from dse.cli import _ops, common
from dse.ops import rankmap
from dse.ops.verdict import exit_code


def register(sub):
    p = sub.add_parser("rankmap", help="print the rank map of a plan: node, local rank, coordinates",
                       epilog="--check " + _ops.EXIT_HELP)
    common.add_cluster_args(p)
    common.add_plan_args(p)
    _ops.add_rankmap_args(p)
    p.add_argument("--ranks", default=None, help="ranks to print: 0,7,8,255,256 or ranges 0-15 (default all)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--check", action="store_true", help="exit 3 when a TP group spans nodes, naming the group")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    cluster = common.cluster_from_args(args)
    rm = _ops.rankmap_from_args(args, cluster)
    ranks = _ops.parse_int_list("--ranks", args.ranks, rm.world) if args.ranks else range(rm.world)
    entries = [rm.entry(r) for r in ranks]
    status = None
    if args.check:
        status, msg, bad = rankmap.tp_check(rm)
    if args.json:
        out = {"world": rm.world, "nodes": rm.nodes, "gpus_per_node": rm.gpus_per_node, "order": list(rm.order),
               "assignment": rm.assignment, "sizes": rm.sizes, "strides": rm.strides, "ranks": entries}
        if status:
            out["check"] = {"status": status, "message": msg, "spanning_tp_groups": [[int(x) for x in g] for g in bad]}
        print(files.dumps(out, indent=2))
    else:
        for e in entries:
            print(rankmap.format_line(e, rm))
        if status:
            print(f"{status}: {msg}")
    return exit_code([status]) if status else 0
