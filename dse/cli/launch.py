"""``dse launch``: a plan as a torchrun line with Megatron-LM flags, a Kubernetes JobSet, a Slurm script,
a torchtitan job config or Megatron-Bridge / NeMo 2 recipe overrides."""

from __future__ import annotations

import json

import numpy as np

from dse import files
from dse.cli import _ops, common
from dse.errors import InputError
from dse.evaluate import derived
from dse.inputs import checks
from dse.ops import launchers, megatron, torchtitan

FORMATS = ("torchrun", "k8s", "slurm", "torchtitan", "bridge", "nemo", "mcore")


def register(sub):
    p = sub.add_parser("launch", help="print a plan as torchrun + Megatron-LM flags, a Kubernetes JobSet, a Slurm "
                                      "script, a torchtitan config, Megatron-Bridge or NeMo 2 overrides")
    common.add_model_args(p)
    common.add_cluster_args(p)
    common.add_plan_args(p)
    _ops.add_rankmap_args(p)
    p.add_argument("--format", default="torchrun", help=f"{'|'.join(FORMATS)} (default torchrun)")
    p.add_argument("--layers-per-virtual-stage", default=None,
                   help="Megatron's --num-layers-per-virtual-pipeline-stage, when no model gives the layers "
                        "(with a model, --vpp v gives L/(p v))")
    p.add_argument("--script", default="train.py", help="training script (default train.py)")
    p.add_argument("--rdzv-endpoint", default="${MASTER_ADDR}:${MASTER_PORT:-29500}",
                   help="HOST:PORT of torchrun's c10d rendezvous (default ${MASTER_ADDR}:${MASTER_PORT:-29500})")
    p.add_argument("--image", default="TRAINER_IMAGE", help="container image of the Kubernetes pods")
    p.add_argument("--name", default="dse-train", help="job name (Kubernetes, Slurm)")
    p.add_argument("--topology-key", default="kubernetes.io/hostname",
                   help="node label of the domain each block of nodes must share (JobSet exclusive placement)")
    p.add_argument("--rdma-resource", default="rdma/rdma_shared_device_a", help="the RDMA device plugin's resource")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)
    return p


def plan_fields(args, cluster) -> tuple[dict, dict | None, float]:
    """The plan (megatron.plan_dict), the model's fields when one is given, and d, validated."""
    common.apply_megatron_args(args)
    has_model = bool(args.preset or args.model_config or getattr(args, "m_layers", None))
    model = common.model_from_args(args) if has_model else None
    p = common.plan_from_args(args, model, cluster)
    d = float(np.asarray(derived(cluster, p)[0]))        # d = N/(t c p)
    plan = megatron.plan_dict(p)
    mfields = megatron.model_dict(model) if model is not None else None
    if model is None:
        lpvs = getattr(args, "megatron_layers_per_virtual_stage", None)
        if args.layers_per_virtual_stage:
            lpvs = int(checks.number("--layers-per-virtual-stage", args.layers_per_virtual_stage, integer=True))
        plan["layers_per_virtual_stage"] = lpvs
    return plan, mfields, d


def run(args) -> int:
    fmt = args.format
    if fmt not in FORMATS:
        raise InputError(f"--format: unknown {fmt!r}; allowed: {', '.join(FORMATS)}")
    cluster = common.cluster_from_args(args)
    plan, model, d = plan_fields(args, cluster)
    d = int(round(d))
    N = int(float(cluster.gpus))
    g = int(checks.number("--gpus-per-node", float(cluster.gpus_per_node), integer=True))
    if N % g:
        raise InputError(f"--gpus: {N} is not a multiple of gpus per node {g}; allowed: whole nodes")
    nodes = N // g
    pairs, notes = megatron.flags(plan, model, gpus_per_node=g, dp=d)
    train_args = [args.script] + megatron.arg_tokens(pairs)
    rm = _ops.rankmap_from_args(args, cluster)
    if fmt == "k8s":
        text = launchers.to_yaml(launchers.jobset(rm, train_args, name=args.name, image=args.image,
                                                  topology_key=args.topology_key, rdma_resource=args.rdma_resource,
                                                  env=megatron.launch_env(plan)))
    elif fmt == "slurm":
        island = float(cluster.island_gpus)
        text = launchers.sbatch(rm, train_args, name=args.name, island_nodes=int(island // g) if island > 0 else 0,
                                env=megatron.launch_env(plan))
    elif fmt == "torchtitan":
        text, more = torchtitan.to_toml(plan, model, dp=d)
        notes = notes + more
    elif fmt == "mcore":      # Megatron-Core config fields, for a script that builds the model itself
        text = json.dumps(megatron.mcore_config(pairs, model, plan), indent=2)
    elif fmt in ("bridge", "nemo"):     # Megatron-Bridge ConfigContainer or NeMo 2 recipe overrides
        text, more = torchtitan.nemo_overrides(plan, model, style=fmt)
        notes = notes + more
    else:
        checks.host_port("--rdzv-endpoint", args.rdzv_endpoint)
        lines = megatron.torchrun_lines(nodes, g, pairs, args.script, args.rdzv_endpoint)
        text = "\n".join(lines + [""] + megatron.expected_log(N, d, plan["vpp"], plan))
    if args.json:
        print(files.dumps({"format": fmt, "text": text, "megatron_flags": [[f, v] for f, v in pairs], "notes": notes,
                          "expected_log": megatron.expected_log(N, d, plan["vpp"], plan), "nodes": nodes,
                          "gpus_per_node": g, "dp": d}, indent=2))
        return 0
    print(text.rstrip("\n"))
    if plan["tp"] > g:
        notes.append(f"TP {plan['tp']} is above {g} GPUs per node: the TP group spans nodes and its collectives "
                     f"go over the NIC (seed 001, Failure Modes)")
    for n in notes:
        print(f"# note: {n}")
    return 0
