"""``dse nccl-log LOG --tp .. --pp ..``: map NCCL's transport lines to the plan; flag TP over NET."""

from __future__ import annotations


from dse import files
from dse.cli import _ops, common
from dse.ops import nccl_log
from dse.ops.verdict import exit_code, worst


def register(sub):
    p = sub.add_parser("nccl-log", help="check NCCL transport lines (NCCL_DEBUG=INFO) against a plan",
                       epilog=_ops.EXIT_HELP + " (FAIL: a TP/SP pair goes over NET)")
    p.add_argument("log", metavar="LOG", help="NCCL_DEBUG=INFO output, or the 'via' lines grepped from it")
    common.add_cluster_args(p)
    common.add_plan_args(p)
    _ops.add_rankmap_args(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    text = files.read_text(args.log, "LOG", "a readable NCCL log")
    cluster = common.cluster_from_args(args)
    rm = _ops.rankmap_from_args(args, cluster)
    channels, nranks = nccl_log.parse(text, args.log)
    nccl_log.check_ranks(channels, nranks, rm, args.log)
    rows = nccl_log.classify(channels, rm, sp=bool(args.p_sp))
    status = worst(r["status"] for r in rows)
    if args.json:
        print(files.dumps({"world": rm.world, "sizes": rm.sizes, "status": status, "pairs": rows}, indent=2))
        return exit_code([status])
    sizes = " ".join(f"{k}={v}" for k, v in rm.sizes.items() if v > 1 or k in ("tp", "pp", "dp"))
    print(f"plan {sizes} on {rm.nodes} nodes of {rm.gpus_per_node}: {len(channels)} channel lines, "
          f"{len(rows)} distinct pairs")
    for r in rows:
        a, b = r["src_coords"], r["dst_coords"]
        where = "same node" if r["same_node"] else "across nodes"
        print(f"{r['status']:<4}  {r['src']:>5} -> {r['dst']:<5} via {r['via']:<18} {r['dimension']:<6} {where:<12}"
              f" ({_c(a, rm)} -> {_c(b, rm)})" + (f"  {r['why']}" if r["why"] else ""))
    bad = [r for r in rows if r["status"] == "FAIL"]
    if bad:
        print(f"FAIL: {len(bad)} TP pair{'s' if len(bad) > 1 else ''} over the network (line "
              f"{', '.join(str(r['line']) for r in bad)}): check the launcher's rank-to-node order "
              f"(dse rankmap --check) and that TP <= GPUs per node")
    else:
        print(f"{status}: no TP pair goes over the network")
    return exit_code([status])


def _c(c: dict, rm) -> str:
    return " ".join(f"{k}{c[k]}" for k in rm.sizes if rm.sizes[k] > 1)
