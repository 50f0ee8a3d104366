"""dse check-log (issue 15 item 4): a job's own start-up lines against the plan, exit status like dse check."""

import json
from pathlib import Path

import pytest

from dse.cli import main
from dse.errors import InputError
from dse.ops import check_log, rankmap

FIX = Path(__file__).resolve().parents[1] / "fixtures"
MEGATRON = FIX / "megatron_job.log"      # TP 8 PP 2 DP 2 on 4 nodes, Megatron's order tp-cp-ep-dp-pp
TITAN = FIX / "torchtitan_job.log"       # dp_shard 2 x tp 8 on 2 nodes, ranks dealt round-robin


def test_rebuilds_the_plan_the_job_ran():
    job = check_log.read(MEGATRON.read_text(), "log")
    imp = check_log.implied(job)
    assert imp["framework"] == "megatron" and imp["world"] == 32 and imp["vpp"] == 1
    assert imp["sizes"] == {"tp": 8, "cp": 1, "ep": 1, "pp": 2, "dp": 2}
    # rank 8 holds dp=1 and rank 16 pp=1: DP inside PP, Megatron's default (parallel_state order tp-cp-ep-dp-pp)
    assert imp["order"] == ["tp", "dp", "pp"] and imp["ranks_per_node"] == 8 and imp["nodes_seen"] == 4


def test_order_difference_fails_and_matching_plan_passes(capsys):
    # dse's default order puts PP inside DP: rank 8 should be pp=1, the job has it at dp=1
    assert main(["check-log", str(MEGATRON), "--tp", "8", "--pp", "2", "--gpus", "32"]) == 3
    out = capsys.readouterr().out
    assert "FAIL  rank order" in out and "rank 8 is tp=0 pp=0 dp=1" in out
    assert main(["check-log", str(MEGATRON), "--tp", "8", "--pp", "2", "--gpus", "32",
                 "--rank-order", "tp,cp,ep,dp,pp"]) == 0
    assert "PASS (exit 0)" in capsys.readouterr().out
    # a size that differs: the plan says TP 4
    assert main(["check-log", str(MEGATRON), "--tp", "4", "--pp", "2", "--gpus", "32", "--json"]) == 3
    res = json.loads(capsys.readouterr().out)
    sizes = next(v for v in res["verdicts"] if v["check"] == "parallel sizes")
    assert sizes["status"] == "FAIL" and "TP 8 (plan 4)" in sizes["summary"]


def test_torchtitan_round_robin_nodes_and_tp_over_net(capsys):
    # no rank-map lines: hosts come from NCCL's init lines; a round-robin scheduler splits every TP group,
    # and NCCL's 0 -> 1 via NET/IB/0 is a TP pair over the network (seed 001, Failure Modes)
    assert main(["check-log", str(TITAN), "--tp", "8", "--gpus", "16", "--json"]) == 3
    res = json.loads(capsys.readouterr().out)
    v = {x["check"]: x for x in res["verdicts"]}
    assert res["implied"]["framework"] == "torchtitan" and res["implied"]["sizes"]["dp"] == 2
    assert v["ranks a node"]["status"] == "FAIL" and "2 TP groups span nodes" in v["ranks a node"]["summary"]
    assert v["TP pairs on NVLink"]["status"] == "FAIL" and "0 -> 1 via NET/IB/0" in v["TP pairs on NVLink"]["summary"]


def test_ep_over_net_warns():
    text = ("using world size: 16, data-parallel size: 16, context-parallel size: 1, hierarchical context-parallel "
            "sizes: None, tensor-model-parallel size: 1, pipeline-model-parallel size: 1\n"
            "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] via NET/IB/0\n")
    rm = rankmap.rank_map(ep=16, gpus_per_node=8)
    res = check_log.check(check_log.read(text), rm)
    v = {x.name: x for x in res["verdicts"]}
    assert v["EP pairs on NVLink"].status == "WARN" and v["TP pairs on NVLink"].status == "PASS"


def test_nothing_to_read(tmp_path, capsys):
    p = tmp_path / "x.log"
    p.write_text("hello\n")
    assert main(["check-log", str(p)]) == 2
    assert "no rank-map" in capsys.readouterr().err
    with pytest.raises(InputError):
        check_log.read("hello", "x")


def test_seed001_rank_map_and_transport_lines(tmp_path, capsys):
    # seed 001's own start-up lines, one log: its rank-map lines (TP 8, PP 4 on 1,024 GPUs) agree with the
    # plan; its NCCL line 3 -> 4 via NET/IB/3 is a TP pair on the network ("TP crossing the node")
    seed = FIX / "seed001"
    log = tmp_path / "job.log"
    log.write_text("> initialized tensor model parallel with size 8\n> initialized pipeline model parallel with size 4\n"
                   + (seed / "rank_map.txt").read_text() + (seed / "nccl_transport.log").read_text())
    assert main(["check-log", str(log), "--tp", "8", "--pp", "4", "--node-prefix", "gpu-node-", "--first-node", "417",
                 "--node-digits", "4", "--json"]) == 3
    v = {x["check"]: x for x in json.loads(capsys.readouterr().out)["verdicts"]}
    assert v["rank order"]["status"] == "PASS" and v["parallel sizes"]["status"] == "PASS"
    assert v["ranks a node"]["status"] == "PASS"
    assert v["TP pairs on NVLink"]["status"] == "FAIL" and "3 -> 4 via NET/IB/3" in v["TP pairs on NVLink"]["summary"]


def test_dse_rankmap_lines_pass_their_own_plan(tmp_path, capsys):
    # what `dse rankmap` prints for a plan is what the job should print: fed back, every check passes
    args = ["--tp", "4", "--cp", "2", "--ep", "2", "--pp", "2", "--gpus", "64"]
    assert main(["rankmap", *args]) == 0
    log = tmp_path / "job.log"
    log.write_text(capsys.readouterr().out)
    assert main(["check-log", str(log), *args]) == 1      # WARN only: no NCCL lines to look at
    out = capsys.readouterr().out
    assert "FAIL" not in out and "PASS  rank order" in out and "WARN  TP/EP pairs on NVLink" in out
    # the same lines against DP inside PP: the order check fails
    assert main(["check-log", str(log), *args, "--rank-order", "tp,cp,ep,dp,pp"]) == 3


def test_launch_expected_log_reads_back(tmp_path, capsys):
    # the start-up lines dse launch says Megatron will print are the lines check-log reads
    args = ["--tp", "8", "--pp", "4", "--vpp", "2", "--gpus", "256", "--layers-per-virtual-stage", "2"]
    assert main(["launch", *args, "--json"]) == 0
    lines = json.loads(capsys.readouterr().out)["expected_log"]
    log = tmp_path / "job.log"
    log.write_text("\n".join(lines) + "\n")
    assert main(["check-log", str(log), "--tp", "8", "--pp", "4", "--vpp", "2", "--gpus", "256", "--json"]) == 1
    v = {x["check"]: x["status"] for x in json.loads(capsys.readouterr().out)["verdicts"]}
    assert v["world size"] == v["parallel sizes"] == v["virtual stages"] == "PASS"
    assert main(["check-log", str(log), "--tp", "8", "--pp", "4", "--gpus", "256"]) == 3   # v 2 against v 1
