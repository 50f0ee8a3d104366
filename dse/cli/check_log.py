"""``dse check-log JOB.log``: a job's rank-map, Megatron/torchtitan and NCCL INFO lines against the plan."""

from __future__ import annotations


from dse import files
from dse.cli import _ops, common
from dse.ops import check_log
from dse.ops.verdict import exit_code, worst


def register(sub):
    p = sub.add_parser("check-log", help="rebuild the plan a job ran from its log and list every difference",
                       epilog=_ops.EXIT_HELP + " (FAIL: a size, the order or the nodes differ, or a TP pair over NET)")
    p.add_argument("log", metavar="JOB.log", help="the job's output: rank-map lines, Megatron or torchtitan start-up "
                                                  "lines, NCCL_DEBUG=INFO lines")
    common.add_cluster_args(p)
    common.add_plan_args(p)
    _ops.add_rankmap_args(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    text = files.read_text(args.log, "JOB.log", "a readable log file")
    cluster = common.cluster_from_args(args)
    rm = _ops.rankmap_from_args(args, cluster)
    plan = common.plan_from_args(args, None, cluster)
    job = check_log.read(text, args.log)
    res = check_log.check(job, rm, vpp=int(float(plan.vpp)), sp=bool(float(plan.sp)))
    vs = res["verdicts"]
    status = worst(v.status for v in vs)
    code = exit_code([status])
    if args.json:
        print(files.dumps({"status": status, "exit": code, "implied": res["implied"],
                          "verdicts": [{"check": v.name, "status": v.status, "summary": v.summary,
                                        "details": list(v.details)} for v in vs],
                          "pairs": res["pairs"]}, indent=2))
        return code
    imp = res["implied"]
    sizes = " ".join(f"{k}{'>=' if k in imp['at_least'] else '='}{v}" for k, v in imp["sizes"].items())
    print(f"log {args.log}: {imp['framework'] or 'no framework'} start-up; {len(job.ranks)} rank-map lines, "
          f"{len(job.channels)} NCCL channel lines; the job ran {sizes or '(sizes not stated)'}"
          + (f", order {','.join(imp['order'])}" if imp.get("order") else ""))
    print(f"plan {' '.join(f'{k}={v}' for k, v in rm.sizes.items())} on {rm.nodes} nodes of {rm.gpus_per_node}, "
          f"order {','.join(rm.order)}, {rm.assignment} assignment")
    for v in vs:
        print(f"{v.status:<4}  {v.name:<22} {v.summary}")
        for d in v.details:
            print(f"{'':<28}{d}")
    print(f"{status} (exit {code})")
    return code
