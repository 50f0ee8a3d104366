"""Megatron-LM and torchrun command lines, both ways, and a Kubernetes worker snippet.

Forward: a plan becomes ``torchrun --nnodes=N/g --nproc-per-node=g train.py`` plus
Megatron-LM's parallelism flags (megatron/training/arguments.py):
--tensor-model-parallel-size, --pipeline-model-parallel-size, --context-parallel-size,
--expert-model-parallel-size, --num-layers-per-virtual-pipeline-stage (= L/(p v)),
--micro-batch-size, --global-batch-size, --sequence-parallel,
--recompute-granularity; ZeRO-1 is Megatron's --use-distributed-optimizer. The pod is
the node (seed 001: "one pod, eight GPUs, eight local ranks"), so a TP group of at
most g ranks cannot be split by the scheduler.

Reverse: ``parse`` reads such a line (torchrun options and Megatron flags, dashes or
underscores, ``--flag=value`` or ``--flag value``) into dse's plan, model and cluster
fields, with Megatron's own defaults for flags the line leaves out (no sequence
parallelism, no recomputation, no distributed optimizer).
"""

from __future__ import annotations

import shlex

from dse.errors import InputError

__all__ = ["FLAGS", "megatron_flags", "torchrun_lines", "expected_log", "k8s_worker", "parse"]

# Megatron flag -> (dse field, kind). Kinds: int, flag (store_true), str.
FLAGS = {
    "--tensor-model-parallel-size": ("tp", int),
    "--pipeline-model-parallel-size": ("pp", int),
    "--context-parallel-size": ("cp", int),
    "--expert-model-parallel-size": ("ep", int),
    "--num-layers-per-virtual-pipeline-stage": ("layers_per_virtual_stage", int),
    "--num-virtual-stages-per-pipeline-rank": ("vpp", int),
    "--micro-batch-size": ("mbs", int),
    "--global-batch-size": ("gbs", int),
    "--sequence-parallel": ("sp", "flag"),
    "--recompute-granularity": ("recompute", str),
    "--use-distributed-optimizer": ("zero", "flag"),
    "--num-layers": ("layers", int),
    "--hidden-size": ("hidden", int),
    "--num-attention-heads": ("heads", int),
    "--num-query-groups": ("kv_heads", int),
    "--ffn-hidden-size": ("ffn_hidden", int),
    "--seq-length": ("seq", int),
    "--num-experts": ("experts", int),
    "--moe-router-topk": ("topk", int),
    "--moe-ffn-hidden-size": ("expert_ffn_hidden", int),
    "--swiglu": ("ffn_gated", "flag"),
}
_TORCHRUN = {"--nnodes": "nnodes", "--nproc-per-node": "nproc_per_node"}
MEGATRON_DEFAULTS = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "mbs": 1, "sp": False, "recompute": "none", "zero": 0}


def megatron_flags(plan: dict, model: dict | None = None) -> list[tuple[str, str | None]]:
    """(flag, value) pairs for a plan (ints: tp, pp, cp, ep, mbs, gbs, vpp, zero, sp; recompute a name).

    ``plan["layers_per_virtual_stage"]`` is used with vpp > 1 (it is L/(p v)).
    ``model`` (optional, ints) adds the shape flags.
    """
    out = [("--tensor-model-parallel-size", plan["tp"]), ("--pipeline-model-parallel-size", plan["pp"])]
    if plan.get("cp", 1) > 1:
        out.append(("--context-parallel-size", plan["cp"]))
    if plan.get("ep", 1) > 1:
        out.append(("--expert-model-parallel-size", plan["ep"]))
    if plan.get("layers_per_virtual_stage"):
        out.append(("--num-layers-per-virtual-pipeline-stage", plan["layers_per_virtual_stage"]))
    out += [("--micro-batch-size", plan["mbs"]), ("--global-batch-size", plan["gbs"])]
    if plan.get("sp") and plan["tp"] > 1:
        out.append(("--sequence-parallel", None))
    rc = plan.get("recompute", "none")
    if rc == "selective":
        out.append(("--recompute-granularity", "selective"))
    elif rc == "full":
        out += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    z = plan.get("zero", 0)
    if z in (1, 2):
        out.append(("--use-distributed-optimizer", None))    # shards optimizer state over DP (ZeRO-1)
    elif z == 3:
        out.append(("--use-torch-fsdp2", None))              # weights, grads and state sharded (ZeRO-3)
    if model:
        out += [("--num-layers", model["layers"]), ("--hidden-size", model["hidden"]),
                ("--num-attention-heads", model["heads"])]
        if model.get("kv_heads") and model["kv_heads"] != model["heads"]:
            out += [("--group-query-attention", None), ("--num-query-groups", model["kv_heads"])]
        out += [("--ffn-hidden-size", model["ffn_hidden"]), ("--seq-length", model["seq"]),
                ("--max-position-embeddings", model["seq"])]
        if model.get("ffn_gated"):
            out.append(("--swiglu", None))
        if model.get("experts", 1) > 1:
            out += [("--num-experts", model["experts"]), ("--moe-router-topk", model["topk"])]
            if model.get("expert_ffn_hidden"):
                out.append(("--moe-ffn-hidden-size", model["expert_ffn_hidden"]))
    return out


def torchrun_lines(nnodes: int, nproc: int, flags, script: str = "train.py", rdzv: str | None = None) -> list[str]:
    """The launch as lines joined by `` \\``: seed 001's layout (one flag a line, batch sizes together)."""
    head = f"torchrun --nnodes={nnodes} --nproc-per-node={nproc}"
    if rdzv:
        head += f" --rdzv-backend=c10d --rdzv-endpoint={rdzv} --rdzv-id=$JOB_ID"
    lines = [f"{head} {script}"]
    flags = list(flags)
    i = 0
    while i < len(flags):
        f, v = flags[i]
        text = f if v is None else f"{f} {v}"
        if f == "--micro-batch-size" and i + 1 < len(flags) and flags[i + 1][0] == "--global-batch-size":
            text += f" --global-batch-size {flags[i + 1][1]}"
            i += 1
        if f == "--recompute-granularity" and v == "full":
            text += f" {flags[i + 1][0]} {flags[i + 1][1]} {flags[i + 2][0]} {flags[i + 2][1]}"
            i += 2
        if f == "--group-query-attention":
            text += f" {flags[i + 1][0]} {flags[i + 1][1]}"
            i += 1
        lines.append("    " + text)
        i += 1
    return [ln + " \\" for ln in lines[:-1]] + [lines[-1]]


def expected_log(world: int, dp: int, vpp: int) -> list[str]:
    """What Megatron should say at start-up for this plan (seed 001's '>' lines)."""
    out = [f"> world size {world}, data-parallel size {dp}"]
    if vpp > 1:
        out.append(f"> using interleaved pipeline schedule, virtual stages {vpp}")
    return out


def k8s_worker(nodes: int, gpus_per_node: int, tp: int, image: str = "TRAINER_IMAGE") -> list[str]:
    """A worker replica spec: one pod per node, the whole node's GPUs, so a TP group is one pod (seed 001)."""
    group = "TP group = 1 pod" if tp <= gpus_per_node else f"TP {tp} > {gpus_per_node} GPUs a pod: TP spans pods"
    return [
        "    - name: worker",
        f"      replicas: {nodes}                # {nodes} pods x {gpus_per_node} GPUs = {nodes * gpus_per_node}, {group}",
        "      template:",
        "        metadata:",
        "          labels: {role: worker}",
        "        spec:",
        "          affinity:",
        "            podAntiAffinity:         # one pod per node",
        "              requiredDuringSchedulingIgnoredDuringExecution:",
        "                - topologyKey: kubernetes.io/hostname",
        "                  labelSelector: {matchLabels: {role: worker}}",
        "          containers:",
        "            - name: trainer",
        f"              image: {image}",
        "              resources:",
        "                limits:",
        f"                  nvidia.com/gpu: {gpus_per_node}      # whole node, no partial allocation",
    ]


def _int(flag: str, value: str) -> int:
    try:
        x = int(value)
    except (TypeError, ValueError):
        raise InputError(f"--megatron-args: {flag} {value!r} is not an integer; allowed: an integer >= 1") from None
    if x < 1:
        raise InputError(f"--megatron-args: {flag} {value!r} is not allowed; allowed: an integer >= 1")
    return x


def parse(text: str) -> dict:
    """A Megatron/torchrun command line -> {"plan": {...}, "model": {...}, "cluster": {...}}.

    Plan fields not on the line take Megatron's defaults (MEGATRON_DEFAULTS); model and
    cluster fields only what the line says. ``cluster["gpus"]`` = nnodes x nproc-per-node.
    """
    try:
        toks = shlex.split(text.replace("\\\n", " "), comments=False)
    except ValueError as exc:
        raise InputError(f"--megatron-args: cannot split the command line ({exc})") from None
    plan, model, cluster, launch = dict(MEGATRON_DEFAULTS), {}, {}, {}
    seen = False
    i = 0
    while i < len(toks):
        tok = toks[i]
        if not tok.startswith("--"):
            i += 1
            continue
        name, eq, val = tok.partition("=")
        name = name.replace("_", "-")
        if name in _TORCHRUN:
            if not eq:
                i += 1
                val = toks[i] if i < len(toks) else ""
            launch[_TORCHRUN[name]] = _int(name, val.split(":")[-1])
        elif name in FLAGS:
            seen = True
            field, kind = FLAGS[name]
            if kind == "flag":
                value = True
            else:
                if not eq:
                    i += 1
                    val = toks[i] if i < len(toks) else ""
                value = _int(name, val) if kind is int else val
            target = model if field in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "seq", "experts",
                                        "topk", "expert_ffn_hidden", "ffn_gated") else plan
            target[field] = value
        i += 1
    if not seen:
        raise InputError("--megatron-args: no Megatron-LM flag found (expected --tensor-model-parallel-size, "
                         "--pipeline-model-parallel-size, --micro-batch-size, ...)")
    if plan["recompute"] not in ("selective", "full", "none"):
        raise InputError(f"--megatron-args: --recompute-granularity {plan['recompute']!r}; allowed: selective, full")
    plan["zero"] = 1 if plan["zero"] is True else 0
    if model.get("ffn_gated") is True:
        model["ffn_gated"] = 1
    if "nnodes" in launch and "nproc_per_node" in launch:
        cluster["gpus"] = launch["nnodes"] * launch["nproc_per_node"]
    if "nproc_per_node" in launch:
        cluster["gpus_per_node"] = launch["nproc_per_node"]
    return {"plan": plan, "model": model, "cluster": cluster}
