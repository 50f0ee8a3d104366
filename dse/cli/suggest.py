"""``dse suggest``: the seeds' planning procedures, their reasoning, and the gap to the best plan."""

from __future__ import annotations


from dse import files
from dse.cli import common
from dse.inputs import SELECTIVE_MODULES, checks, recompute_name
from dse.errors import InputError
from dse.ops import suggest

PROCEDURES = ("both", "seed001", "seed000")


def register(sub):
    p = sub.add_parser("suggest", help="pick a plan by seed 000's procedure and seed 001's default; "
                                       "compare with the best plan of the same space")
    common.add_model_args(p)
    common.add_cluster_args(p)
    p.add_argument("--gbs", required=True, help="global batch B (sequences)")
    p.add_argument("--mbs", default="1", help="microbatch b for seed 001's default (default 1)")
    p.add_argument("--procedure", default="both", help="both (default), seed001 or seed000")
    p.add_argument("--fidelity", default="seed", help="seed|calibrated (default seed)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)
    return p


def _plan_text(tab, i) -> str:
    pl = tab.plan(i)
    return (f"t={pl['tp']:g} p={pl['pp']:g} e={pl['ep']:g} d={tab.dp[i]:g} v={pl['vpp']:g} b={pl['mbs']:g} "
            f"m={tab.microbatches[i]:g} recompute={recompute_name(pl['recompute'], pl['recompute_every'], pl.get('recompute_modules', SELECTIVE_MODULES))} ZeRO-{pl['zero']:g}")


def run(args) -> int:
    if args.procedure not in PROCEDURES:
        raise InputError(f"--procedure: unknown {args.procedure!r}; allowed: {', '.join(PROCEDURES)}")
    common.enable_x64()
    model = common.model_from_args(args)
    cluster = common.cluster_from_args(args)
    common.fidelity_from_args(args)   # validates the name; the sweep takes it by name
    gbs = checks.number("--gbs", args.gbs, integer=True)
    mbs = checks.number("--mbs", args.mbs, integer=True)
    space = suggest.default_space(model, cluster)
    if mbs not in space.mbs:
        raise InputError(f"--mbs: {mbs:g} is not in the space; allowed: {', '.join(map(str, space.mbs))}")
    tab = suggest.table(model, cluster, gbs, args.fidelity, space)
    b, n_ok = suggest.best(tab)
    choices = []
    if args.procedure in ("both", "seed001"):
        choices.append(suggest.seed001(tab, model, cluster, mbs))
    if args.procedure in ("both", "seed000"):
        choices.append(suggest.seed000(tab, model, cluster))
    if args.json:
        def entry(i):
            return None if i is None else {"plan": tab.plan(i), "dp": float(tab.dp[i]),
                                           "microbatches": float(tab.microbatches[i]), "step_s": float(tab.step_s[i]),
                                           "mfu": float(tab.mfu[i]), "memory_bytes": float(tab.memory_bytes[i])}
        out = {"space_size": space.distinct, "grid_points": space.size, "feasible": n_ok, "best": entry(b),
               "choices": [{"procedure": c.name, "reasoning": c.reasoning, **(entry(c.row) or {}),
                            "gap_to_best": (float(tab.step_s[c.row] / tab.step_s[b] - 1) if c.row is not None
                                            and b is not None else None)} for c in choices]}
        print(files.dumps(out, indent=2))
        return 0 if b is not None else 3
    if b is None:
        print(f"no plan of the {space.distinct} in the space fits; try more GPUs, a smaller batch or ZeRO-3")
        return 3
    for c in choices:
        if c.row is None:
            print(f"{c.name}: no plan")
        else:
            gap = tab.step_s[c.row] / tab.step_s[b] - 1
            print(f"{c.name}: {_plan_text(tab, c.row)}")
            print(f"  step {tab.step_s[c.row]:.3f} s, MFU {100 * tab.mfu[c.row]:.1f}%, "
                  f"{tab.memory_bytes[c.row] / 1e9:.1f} GB a GPU; {100 * gap:.1f}% slower than the best")
        for w in c.reasoning:
            print(f"  - {w}")
    print(f"best of {space.distinct} plans ({n_ok} feasible; t, p, e, v, b, recompute, ZeRO exhaustively): "
          f"{_plan_text(tab, b)}")
    print(f"  step {tab.step_s[b]:.3f} s, MFU {100 * tab.mfu[b]:.1f}%, {tab.memory_bytes[b] / 1e9:.1f} GB a GPU")
    return 0
