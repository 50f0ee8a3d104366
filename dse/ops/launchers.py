"""Launchable jobs for a plan: a Kubernetes JobSet manifest and a Slurm sbatch script.

Both keep a node's ranks together and keep the plan's rank map: one pod (or one Slurm
task) per node holding all its GPUs, torchrun's node rank set from the pod's (task's)
index, so global rank = node rank x GPUs a node + local rank, the block assignment
``dse rankmap`` prints (seed 001: "one pod, eight GPUs, eight local ranks"). torchrun's
static rendezvous (``--node-rank`` with ``--master-addr``) is used here because c10d
rendezvous hands out node ranks in arrival order (torch.distributed.run), which would
undo the placement.

Topology: ranks are numbered innermost dimension first, so the job splits into
``blocks`` of consecutive nodes that share every dimension but the outermost one
(the DP replicas under dse's order TP, CP, EP, PP, DP; the pipeline stages under
Megatron's default TP, CP, EP, DP, PP). Kubernetes: one child Job per block with
JobSet's ``alpha.jobset.sigs.k8s.io/exclusive-topology`` annotation, so each block
lands inside one topology domain (kubernetes-sigs/jobset, docs "Exclusive placement").
Slurm: ``--segment`` (topology/block plugin, Slurm 23.11) and ``--switches``.
"""

from __future__ import annotations

import json
import shlex

from dse.errors import InputError
from dse.ops.rankmap import RankMap

__all__ = ["blocks", "jobset", "to_yaml", "sbatch", "NCCL_ENV"]

JOBSET_API = "jobset.x-k8s.io/v1alpha2"       # kubernetes-sigs/jobset, api/jobset/v1alpha2
EXCLUSIVE = "alpha.jobset.sigs.k8s.io/exclusive-topology"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"    # pod annotation JobSet sets
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"   # Indexed Job (k8s 1.24+)
MASTER_PORT = 29500                           # torch.distributed.run's default

# NCCL environment for a training job (NCCL docs, "Environment Variables"): INFO prints the
# transport of every channel (what ``dse check-log`` reads). The framework's own variables
# (Megatron's CUDA_DEVICE_MAX_CONNECTIONS, ``megatron.launch_env``) come in through ``env``.
NCCL_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,GRAPH,ENV", "NCCL_IB_DISABLE": "0",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def _env(extra: dict | None) -> dict:
    """NCCL_ENV with the caller's entries; a value of None removes one."""
    out = {**NCCL_ENV, **(extra or {})}
    return {k: v for k, v in out.items() if v is not None}


def blocks(rm: RankMap) -> tuple[int, int, str]:
    """(blocks, nodes a block, outermost dimension): consecutive nodes sharing all but the outermost dimension."""
    outer = next((k for k in reversed(rm.order) if rm.sizes[k] > 1), rm.order[-1])
    per = rm.world // rm.sizes[outer]
    if per % rm.gpus_per_node:
        return 1, rm.nodes, outer        # a block smaller than a node: the whole job is one block
    return rm.sizes[outer], per // rm.gpus_per_node, outer


def _command(train_args: list[str], nproc: int, nnodes: int, master: str, node_rank: str) -> str:
    return (f"torchrun --nnodes={nnodes} --nproc-per-node={nproc} --node-rank={node_rank} "
            f"--master-addr={master} --master-port={MASTER_PORT} " + " ".join(shlex.quote(a) for a in train_args))


def jobset(rm: RankMap, train_args: list[str], *, name: str = "dse-train", image: str = "TRAINER_IMAGE",
           topology_key: str = "kubernetes.io/hostname", rdma_resource: str = "rdma/rdma_shared_device_a",
           shm_gib: int = 64, env: dict | None = None) -> dict:
    """A JobSet: one child Job a block, one pod a node (all its GPUs), node rank = job index x nodes + pod index.

    ``train_args``: the script and its flags (``[script, *megatron flags]``).
    ``topology_key``: the node label of the domain a block must stay inside (a rack or NVLink
    block label where the cluster has one; ``kubernetes.io/hostname`` keeps only nodes whole).
    """
    if not name.replace("-", "").isalnum() or name != name.lower():
        raise InputError(f"--name: {name!r} is not a Kubernetes name; allowed: lower-case letters, digits and -")
    n_blocks, per, outer = blocks(rm)
    g = rm.gpus_per_node
    master = f"{name}-workers-0-0.{name}"      # JobSet pod hostname <jobset>-<replicatedJob>-<job>-<pod>.<subdomain>
    # `let`, not $((..)): Kubernetes expands $(NAME) in a container command itself (pod spec, "command")
    node_rank = "$NODE_RANK"
    envs = [{"name": k, "value": str(v)} for k, v in _env(env).items()]
    envs += [{"name": "JOB_INDEX", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{JOB_INDEX}']"}}},
             {"name": "JOB_COMPLETION_INDEX",
              "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}}]
    pod = {
        "metadata": {"labels": {"app": name, "role": "worker"}},
        "spec": {
            "restartPolicy": "Never",
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname",            # one pod a node: a node's ranks stay together
                 "labelSelector": {"matchLabels": {"app": name}}}]}},
            "containers": [{
                "name": "trainer", "image": image,
                "command": ["bash", "-c", f"let \"NODE_RANK=JOB_INDEX*{per}+JOB_COMPLETION_INDEX\"; exec "
                                          + _command(train_args, g, rm.nodes, master, node_rank)],
                "env": envs,
                "ports": [{"containerPort": MASTER_PORT, "name": "rendezvous"}],
                "resources": {"limits": {"nvidia.com/gpu": g, rdma_resource: 1},
                              "requests": {"nvidia.com/gpu": g, rdma_resource: 1}},
                "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},   # RDMA pins memory
                "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
            }],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_gib}Gi"}}],
        },
    }
    job_spec = {"parallelism": per, "completions": per, "completionMode": "Indexed", "backoffLimit": 0,
                "template": pod}
    return {
        "apiVersion": JOBSET_API, "kind": "JobSet",
        "metadata": {"name": name, "annotations": {EXCLUSIVE: topology_key}},
        "spec": {
            "network": {"enableDNSHostnames": True, "subdomain": name},
            "failurePolicy": {"maxRestarts": 0},
            "replicatedJobs": [{"name": "workers", "replicas": n_blocks,
                                "template": {"metadata": {"annotations": {
                                    "dse/block": f"{per} nodes sharing all but {outer.upper()}"}},
                                             "spec": job_spec}}],
        },
    }


def to_yaml(obj, indent: int = 0) -> str:
    """Block YAML for dicts, lists and scalars (strings JSON-quoted where YAML would misread them)."""
    pad = "  " * indent
    lines = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{_scalar(k)}:")
                lines.append(to_yaml(v, indent + 1))
            else:
                lines.append(f"{pad}{_scalar(k)}: {_scalar(v)}")
    elif isinstance(obj, list):
        for v in obj:
            if isinstance(v, (dict, list)) and v:
                body = to_yaml(v, indent + 1).splitlines()
                lines.append(f"{pad}- {body[0].strip()}")
                lines += body[1:]
            else:
                lines.append(f"{pad}- {_scalar(v)}")
    else:
        lines.append(pad + _scalar(obj))
    return "\n".join(lines)


def _scalar(v) -> str:
    if v is True or v is False:
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, dict) or isinstance(v, list):
        return "{}" if isinstance(v, dict) else "[]"
    s = str(v)
    plain = s and s[0].isalpha() and all(ch.isalnum() or ch in "-_./" for ch in s) \
        and s.lower() not in ("true", "false", "yes", "no", "on", "off", "null", "y", "n")
    return s if plain else json.dumps(s)


def sbatch(rm: RankMap, train_args: list[str], *, name: str = "dse-train", island_nodes: int = 0,
           env: dict | None = None, time: str = "04:00:00") -> str:
    """A Slurm batch script: one task a node with all its GPUs, torchrun's node rank = SLURM_NODEID.

    Block distribution keeps consecutive node ranks on the allocation's node order; ``--segment``
    keeps each block of nodes in one topology block, ``--switches=1`` the whole job under one
    leaf switch group when it fits an island (Slurm sbatch(1), topology/block and topology/tree).
    """
    n_blocks, per, outer = blocks(rm)
    g = rm.gpus_per_node
    lines = ["#!/bin/bash", f"#SBATCH --job-name={name}", f"#SBATCH --nodes={rm.nodes}",
             "#SBATCH --ntasks-per-node=1", f"#SBATCH --gpus-per-node={g}", "#SBATCH --exclusive",
             f"#SBATCH --time={time}", "#SBATCH --distribution=block:block"]
    if n_blocks > 1:
        lines.append(f"#SBATCH --segment={per}      # {n_blocks} blocks of {per} nodes sharing all but {outer.upper()}")
    if island_nodes and rm.nodes <= island_nodes:
        lines.append("#SBATCH --switches=1       # the whole job inside one island")
    lines.append("")
    for k, v in _env(env).items():
        lines.append(f"export {k}={shlex.quote(str(v))}")
    lines += ['export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              f"export MASTER_PORT={MASTER_PORT}", ""]
    cmd = _command(train_args, g, rm.nodes, "$MASTER_ADDR", "$SLURM_NODEID")
    lines.append(f"srun --kill-on-bad-exit=1 --ntasks={rm.nodes} --ntasks-per-node=1 bash -c {shlex.quote(cmd)}")
    return "\n".join(lines) + "\n"
