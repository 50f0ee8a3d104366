"""``dse launch``: the torchrun line, Megatron-LM flags and a Kubernetes worker spec for a plan."""

from __future__ import annotations


import numpy as np

from dse import files
from dse.cli import common
from dse.inputs import checks
from dse.errors import InputError
from dse.inputs import RECOMPUTE
from dse.ops import megatron

RECOMPUTE_NAMES = {v: k for k, v in RECOMPUTE.items()}


def register(sub):
    p = sub.add_parser("launch", help="print the torchrun line, Megatron-LM flags and a Kubernetes worker spec")
    common.add_model_args(p)
    common.add_cluster_args(p)
    common.add_plan_args(p)
    p.add_argument("--layers-per-virtual-stage", default=None,
                   help="Megatron's --num-layers-per-virtual-pipeline-stage, when no model gives the layers "
                        "(with a model, --vpp v gives L/(p v))")
    p.add_argument("--script", default="train.py", help="training script (default train.py)")
    p.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT: add torchrun's c10d rendezvous options")
    p.add_argument("--image", default="TRAINER_IMAGE", help="container image in the Kubernetes snippet")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)
    return p


def _has_model(args) -> bool:
    common.apply_megatron_args(args)
    return bool(args.preset or args.model_config or getattr(args, "m_layers", None))


def plan_fields(args, cluster) -> tuple[dict, dict | None]:
    """Integer plan fields for Megatron (and the model's, when one is given), validated."""
    if _has_model(args):
        model = common.model_from_args(args)
    else:
        model = None
    plan = common.plan_from_args(args, model, cluster)
    f = {k: float(np.asarray(v)) for k, v in plan.to_dict().items()}
    if model is not None:
        L, p, v = float(model.layers), f["pp"], f["vpp"]
        if v > 1 and L % (p * v):
            raise InputError(f"--vpp: layers {L:g} is not a multiple of pp*vpp = {p * v:g}; allowed: divisors of layers/pp")
        lpvs = int(L / (p * v)) if v > 1 else None
        mfields = {k: int(float(np.asarray(getattr(model, k)))) for k in
                   ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "seq", "experts", "topk",
                    "expert_ffn_hidden", "ffn_gated")}
    else:
        lpvs = getattr(args, "megatron_layers_per_virtual_stage", None)
        if args.layers_per_virtual_stage:
            lpvs = int(checks.number("--layers-per-virtual-stage", args.layers_per_virtual_stage, integer=True))
        if f["vpp"] > 1 and not lpvs:
            raise InputError("--vpp: give a model (--preset or --layers) or --layers-per-virtual-stage, so that "
                             "--num-layers-per-virtual-pipeline-stage = L/(p v) is known")
        mfields = None
    out = {k: int(f[k]) for k in ("tp", "pp", "cp", "ep", "mbs", "gbs", "zero", "vpp")}
    out["sp"] = bool(f["sp"])
    out["recompute"] = RECOMPUTE_NAMES[float(f["recompute"])]
    out["layers_per_virtual_stage"] = lpvs
    return out, mfields


def run(args) -> int:
    cluster = common.cluster_from_args(args)
    plan, model = plan_fields(args, cluster)
    N = int(float(cluster.gpus))
    g = int(checks.number("--gpus-per-node", float(cluster.gpus_per_node), integer=True))
    if N % g:
        raise InputError(f"--gpus: {N} is not a multiple of gpus per node {g}; allowed: whole nodes")
    nodes = N // g
    d = N // (plan["tp"] * plan["cp"] * plan["pp"])
    vpp = plan["vpp"]   # without a model and with only layers per virtual stage, v is unknown (1): no line
    flags = megatron.megatron_flags(plan, model)
    if args.rdzv_endpoint is not None:
        checks.host_port("--rdzv-endpoint", args.rdzv_endpoint)
    lines = megatron.torchrun_lines(nodes, g, flags, args.script, args.rdzv_endpoint)
    expect = megatron.expected_log(N, d, vpp)
    k8s = megatron.k8s_worker(nodes, g, plan["tp"], args.image)
    if args.json:
        print(files.dumps({"torchrun": " ".join(ln.rstrip(" \\").strip() for ln in lines),
                          "megatron_flags": [[f, v] for f, v in flags], "expected_log": expect,
                          "kubernetes_worker": "\n".join(k8s), "nodes": nodes, "gpus_per_node": g, "dp": d}, indent=2))
        return 0
    print("\n".join(lines))
    print()
    print("\n".join(expect))
    if plan["tp"] > g:
        print(f"warning: TP {plan['tp']} is above {g} GPUs per node: the TP group spans pods and its collectives "
              f"go over the NIC (seed 001, Failure Modes)")
    print()
    print("\n".join(k8s))
    return 0
