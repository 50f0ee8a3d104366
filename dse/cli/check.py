"""``dse check``: the four questions of seed 001 for a plan on a cluster, PASS/WARN/FAIL with numbers."""

from __future__ import annotations


import numpy as np

from dse import files
from dse.cli import _ops, common
from dse.inputs import checks
from dse.cli.plan import load
from dse.equations.degrees import folds_experts
from dse.ops import check
from dse.ops.verdict import exit_code, worst


def register(sub):
    p = sub.add_parser("check", help="the four questions (TP in a node, job in an island, DP hidden, m >= 4p)",
                       epilog=_ops.EXIT_HELP)
    common.add_model_args(p)
    common.add_cluster_args(p)
    common.add_plan_args(p)
    _ops.add_rankmap_args(p)
    p.add_argument("--busbw", default=None, metavar="GBps",
                   help="measured bus bandwidth of the DP all-reduce, GB/s (from dse nccl-tests); default: "
                        "the cluster's bandwidth on DP's tier")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    model, cluster, plan, fid = load(args)
    busbw = checks.number("--busbw", args.busbw) * 1e9 if args.busbw else None
    res = check.four_questions(model, cluster, plan, fid, busbw_bytes_per_s=busbw,
                               rank_map=_ops.rankmap_from_args(args, cluster))
    vs = res["verdicts"]
    status = worst(v.status for v in vs)
    code = exit_code([status])
    if args.json:
        print(files.dumps({"status": status, "exit": code,
                          "verdicts": [{"question": v.name, "status": v.status, "summary": v.summary,
                                        "details": list(v.details)} for v in vs],
                          "report": res["report"].to_json()}, indent=2))
        return code
    f = lambda x: float(np.asarray(x))  # noqa: E731
    c = res["cluster"]
    rm = res["rank_map"]
    island = f(c.island_gpus)
    folded = " (folded over TP, ETP 1)" if folds_experts(plan) else ""
    print(f"plan t={rm.sizes['tp']} c={rm.sizes['cp']} e={f(plan.ep):g}{folded} p={rm.sizes['pp']} "
          f"d={rm.sizes['dp'] * rm.sizes['ep']} b={f(plan.mbs):g} B={f(plan.gbs):g} v={f(plan.vpp):g} on "
          f"{f(c.gpus):g} GPUs, {f(c.gpus_per_node):g} a node, domain {f(c.domain):g}, "
          f"island {'whole cluster' if island <= 0 else f'{island:g}'}")
    for i, v in enumerate(vs, 1):
        label = f"{i}" if i <= 4 else "+"
        print(f"{v.status:<4}  {label} {v.name:<26} {v.summary}")
        for d in v.details:
            print(f"{'':<8}{'':<26} {d}")
    print(f"{status} (exit {code})")
    return code
