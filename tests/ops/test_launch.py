"""dse launch (seed 001's torchrun example), launchable manifests (issue 15 item 3) and --megatron-args."""

import json
import re
from pathlib import Path

import pytest

from dse.cli import main
from dse.errors import InputError
from dse.ops import launchers, megatron, rankmap

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "seed001"


def _lines(text):
    return [ln.rstrip().rstrip("\\").rstrip() for ln in text.splitlines()]


def _seed_lines():
    """seed 001's torchrun example, with the c10d rendezvous dse adds to its head line.

    Before issue 15 the head was the seed's bare ``torchrun --nnodes=128 --nproc-per-node=8 train.py``,
    which has no rendezvous and cannot start on 128 nodes; the flags below it are the seed's, unchanged."""
    seed = _lines((FIX / "torchrun.txt").read_text().replace("$ ", "", 1))
    seed[0] = seed[0].replace(" train.py", " --rdzv-backend=c10d --rdzv-endpoint=${MASTER_ADDR}:${MASTER_PORT:-29500}"
                                           " --rdzv-id=${JOB_ID:-dse} train.py")
    return seed


def test_seed_torchrun_example(capsys):
    # seed 001: TP 8, PP 4, 1,024 GPUs, interleaved with 2 layers per virtual stage, b = 1, B = 2,048
    # (a 16-layer model makes v = 16 / (4 x 2) = 2, the seed's "virtual stages 2")
    assert main(["launch", "--layers", "16", "--hidden", "4096", "--heads", "32",
                 "--tp", "8", "--pp", "4", "--vpp", "2", "--gbs", "2048"]) == 0
    out = _lines(capsys.readouterr().out)
    seed = _seed_lines()
    assert out[:len(seed)] == seed
    assert "    --overlap-grad-reduce" in out      # issue 15: dse models DP overlap on; Megatron's default is off
    assert "> world size 1024, data-parallel size 32" in out
    assert "> using interleaved pipeline schedule, virtual stages 2" in out


def test_without_model(capsys):
    assert main(["launch", "--tp", "8", "--pp", "4", "--layers-per-virtual-stage", "2", "--gbs", "2048"]) == 0
    out = _lines(capsys.readouterr().out)
    seed = _seed_lines()
    assert out[:len(seed)] == seed
    # before issue 15 --vpp without layers was refused (exit 2); Megatron takes the virtual stages directly
    assert main(["launch", "--tp", "8", "--pp", "4", "--vpp", "2"]) == 0
    assert "--num-virtual-stages-per-pipeline-rank 2" in capsys.readouterr().out


def test_round_trip_with_cluster():
    plan = megatron.plan_dict(__import__("dse.inputs", fromlist=["Plan"]).Plan.make(
        tp=8, pp=4, cp=2, ep=4, mbs=2, gbs=512, recompute=2.0, zero=1, sp=1))
    plan["layers_per_virtual_stage"] = 2
    text = "\n".join(megatron.torchrun_lines(16, 8, megatron.flags(plan)[0]))
    back = megatron.parse(text)
    assert back["cluster"] == {"gpus": 128, "gpus_per_node": 8}
    assert back["plan"]["layers_per_virtual_stage"] == 2 and back["plan"]["recompute"] == "full"


def test_megatron_defaults_and_underscores():
    p = megatron.parse("python pretrain_gpt.py --tensor_model_parallel_size=4 --micro-batch-size 2")["plan"]
    # Megatron's defaults for what the line leaves out: no SP, no recompute, no distributed optimizer
    assert p["tp"] == 4 and p["mbs"] == 2 and p["pp"] == 1 and not p["sp"] and p["recompute"] == "none" and p["zero"] == 0
    with pytest.raises(InputError):
        megatron.parse("python train.py --lr 3e-4")


def test_plan_reads_megatron_args(capsys):
    seed = (FIX / "torchrun.txt").read_text().replace("$ ", "", 1)
    assert main(["plan", "--layers", "16", "--hidden", "4096", "--heads", "32", "--json",
                 "--megatron-args", seed]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["tp"] == 8 and out["plan"]["pp"] == 4 and out["plan"]["vpp"] == 2
    assert out["dp"] == 32 and out["microbatches"] == 64          # 2048 / (32 x 1)
    assert out["plan"]["overlap_grad_reduce"] == 0                # the seed's line has no --overlap-grad-reduce
    # a dse flag wins over the Megatron line
    assert main(["plan", "--layers", "16", "--hidden", "4096", "--heads", "32", "--json", "--pp", "2",
                 "--megatron-args", seed]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["pp"] == 2


def test_json(capsys):
    assert main(["launch", "--tp", "8", "--pp", "4", "--gbs", "2048", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nodes"] == 128 and out["dp"] == 32
    assert out["text"].startswith("torchrun --nnodes=128 --nproc-per-node=8 --rdzv-backend=c10d")


def _manifest(capsys, *extra):
    yaml = pytest.importorskip("yaml")
    assert main(["launch", "--preset", "llama3-8b", "--tp", "8", "--pp", "2", "--gpus", "64", "--gbs", "256",
                 "--format", "k8s", *extra]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_kubernetes_manifest_validates(capsys):
    # issue 15: the Kubernetes text was one list item with no apiVersion/kind, command, env, RDMA or /dev/shm.
    # Now a JobSet; its pod template is checked against the Kubernetes schemas (kubernetes-validate ships
    # them, so this runs offline), as the batch/v1 Job JobSet creates from it.
    kv = pytest.importorskip("kubernetes_validate")
    js = _manifest(capsys)
    assert js["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and js["kind"] == "JobSet"
    assert js["metadata"]["annotations"][launchers.EXCLUSIVE] == "kubernetes.io/hostname"
    rj = js["spec"]["replicatedJobs"][0]
    # dse order TP, CP, EP, PP, DP: 64 / (8 x 2) = 4 DP replicas of 16 ranks = 2 nodes each
    assert rj["replicas"] == 4 and rj["template"]["spec"]["parallelism"] == 2
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "dse-train-workers-0", **rj["template"]["metadata"]}, "spec": rj["template"]["spec"]}
    kv.validate(job, kv.latest_version(), strict=True)
    # the check has teeth: a volume mount without its path, or an unknown field, is refused
    import copy

    bad = copy.deepcopy(job)
    del bad["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["mountPath"]
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, kv.latest_version(), strict=True)
    bad = copy.deepcopy(job)
    bad["spec"]["template"]["spec"]["containers"][0]["gpus"] = 8
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, kv.latest_version(), strict=True)
    pod = rj["template"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8 and c["resources"]["limits"]["rdma/rdma_shared_device_a"] == 1
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert pod["volumes"][0]["emptyDir"]["medium"] == "Memory"
    env = {e["name"]: e for e in c["env"]}
    assert env["NCCL_DEBUG"]["value"] == "INFO" and "fieldRef" in env["JOB_COMPLETION_INDEX"]["valueFrom"]
    cmd = c["command"][2]
    assert cmd.startswith('let "NODE_RANK=JOB_INDEX*2+JOB_COMPLETION_INDEX"; exec torchrun')
    assert "--node-rank=$NODE_RANK" in cmd and "--tensor-model-parallel-size 8" in cmd
    assert "$(" not in cmd          # Kubernetes would expand $(NAME) in the command itself
    assert "--nnodes=8 --nproc-per-node=8" in cmd


def test_manifest_block_follows_rank_order():
    # Megatron's order TP, CP, EP, DP, PP: the consecutive blocks are pipeline stages (all their DP replicas)
    rm = rankmap.rank_map(tp=8, pp=2, dp=4, gpus_per_node=8, order=("tp", "cp", "ep", "dp", "pp"))
    assert launchers.blocks(rm) == (2, 4, "pp")
    rm = rankmap.rank_map(tp=2, pp=1, dp=8, gpus_per_node=8)   # a replica smaller than a node: one block
    assert launchers.blocks(rm) == (1, 2, "dp")


def test_slurm_script(capsys):
    assert main(["launch", "--preset", "llama3-8b", "--tp", "8", "--pp", "2", "--gpus", "64", "--gbs", "256",
                 "--format", "slurm"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("#!/bin/bash\n")
    for want in ("#SBATCH --nodes=8", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8", "#SBATCH --segment=2",
                 "export NCCL_DEBUG=INFO", "export CUDA_DEVICE_MAX_CONNECTIONS=1", "srun "):
        assert want in out
    srun = next(ln for ln in out.splitlines() if ln.startswith("srun "))
    assert "--node-rank=$SLURM_NODEID" in srun and "--master-addr=$MASTER_ADDR" in srun
    assert re.search(r"--tensor-model-parallel-size 8 --pipeline-model-parallel-size 2", srun)


def test_yaml_writer_quotes_what_yaml_would_misread():
    yaml = pytest.importorskip("yaml")
    obj = {"a": "yes", "b": "1.0", "c": ["x y", {"d": True, "e": 3}], "f": "metadata.annotations['x/y']"}
    assert yaml.safe_load(launchers.to_yaml(obj)) == obj


def test_cuda_device_max_connections_as_megatron_checks(capsys):
    # arguments.py: TP > 1 needs CUDA_DEVICE_MAX_CONNECTIONS=1; Megatron-FSDP refuses 1
    assert main(["launch", "--preset", "llama3-8b", "--tp", "8", "--gpus", "16", "--gbs", "64", "--format", "slurm"]) == 0
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in capsys.readouterr().out
    assert main(["launch", "--preset", "llama3-8b", "--tp", "8", "--gpus", "16", "--gbs", "64", "--zero", "3",
                 "--grad-accum", "reduce", "--format", "slurm"]) == 0
    out = capsys.readouterr().out
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in out and "--ckpt-format fsdp_dtensor" in out


def test_mcore_format(capsys):
    assert main(["launch", "--preset", "mixtral-8x7b", "--tp", "2", "--ep", "4", "--gpus", "64", "--gbs", "256",
                 "--format", "mcore"]) == 0
    out = capsys.readouterr().out
    cfg = json.loads(out[:out.rindex("}") + 1])
    assert cfg["TransformerConfig"]["num_moe_experts"] == 8 and cfg["TransformerConfig"]["sequence_parallel"] is True
    assert cfg["DistributedDataParallelConfig"]["overlap_grad_reduce"] is True
