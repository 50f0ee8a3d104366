"""dse launch (seed 001's torchrun example and pod spec) and the reverse, --megatron-args."""

from pathlib import Path

import pytest

from dse.cli import main
from dse.errors import InputError
from dse.ops import megatron

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "seed001"


def _lines(text):
    return [ln.rstrip().rstrip("\\").rstrip() for ln in text.splitlines()]


def _subsequence(needle, hay):
    it = iter(hay)
    return all(any(h == n for h in it) for n in needle)


def test_seed_torchrun_example(capsys):
    # seed 001: TP 8, PP 4, 1,024 GPUs, interleaved with 2 layers per virtual stage, b = 1, B = 2,048
    # (a 16-layer model makes v = 16 / (4 x 2) = 2, the seed's "virtual stages 2")
    assert main(["launch", "--layers", "16", "--hidden", "4096", "--heads", "32",
                 "--tp", "8", "--pp", "4", "--vpp", "2", "--gbs", "2048"]) == 0
    out = _lines(capsys.readouterr().out)
    seed = _lines((FIX / "torchrun.txt").read_text().replace("$ ", "", 1))
    assert out[:len(seed)] == seed
    assert "> world size 1024, data-parallel size 32" in out
    assert "> using interleaved pipeline schedule, virtual stages 2" in out
    assert _subsequence(_lines((FIX / "k8s_worker.yaml").read_text()), out)


def test_without_model(capsys):
    assert main(["launch", "--tp", "8", "--pp", "4", "--layers-per-virtual-stage", "2", "--gbs", "2048"]) == 0
    out = _lines(capsys.readouterr().out)
    seed = _lines((FIX / "torchrun.txt").read_text().replace("$ ", "", 1))
    assert out[:len(seed)] == seed
    assert main(["launch", "--tp", "8", "--pp", "4", "--vpp", "2"]) == 2     # L/(p v) unknown


def test_round_trip():
    plan = {"tp": 8, "pp": 4, "cp": 2, "ep": 4, "mbs": 2, "gbs": 512, "sp": True, "recompute": "full",
            "zero": 1, "layers_per_virtual_stage": 2}
    model = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336, "seq": 8192,
             "experts": 8, "topk": 2, "expert_ffn_hidden": 0, "ffn_gated": 1}
    text = "\n".join(megatron.torchrun_lines(16, 8, megatron.megatron_flags(plan, model)))
    back = megatron.parse(text)
    assert back["cluster"] == {"gpus": 128, "gpus_per_node": 8}
    assert back["plan"] == plan
    assert {k: back["model"][k] for k in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "seq",
                                          "experts", "topk", "ffn_gated")} == {k: v for k, v in model.items()
                                                                             if k != "expert_ffn_hidden"}


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
    import json
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["tp"] == 8 and out["plan"]["pp"] == 4 and out["plan"]["vpp"] == 2
    assert out["dp"] == 32 and out["microbatches"] == 64          # 2048 / (32 x 1)
    # a dse flag wins over the Megatron line
    assert main(["plan", "--layers", "16", "--hidden", "4096", "--heads", "32", "--json", "--pp", "2",
                 "--megatron-args", seed]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["pp"] == 2


def test_json(capsys):
    import json
    assert main(["launch", "--tp", "8", "--pp", "4", "--gbs", "2048", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nodes"] == 128 and out["dp"] == 32
    assert out["torchrun"].startswith("torchrun --nnodes=128 --nproc-per-node=8 train.py --tensor-model-parallel-size 8")
    assert "replicas: 128" in out["kubernetes_worker"]
