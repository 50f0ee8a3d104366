"""dse check: seed 001's four questions, each verdict from evaluate's numbers."""

import json

import pytest

import dse
from dse.inputs import presets
from dse.cli import main
from dse.ops import check
from dse.ops.verdict import FAIL, PASS, WARN, exit_code

GPT3 = ["--preset", "gpt3-175b"]


def verdicts(argv):
    return main(["check", *argv, "--json"])


def run_json(capsys, argv):
    code = main(["check", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_seed_worked_example_passes(capsys):
    # seed 000's worked example (t 8, p 8, d 16, m 64) on the seed cluster: all four PASS, exit 0
    code, out = run_json(capsys, [*GPT3, "--tp", "8", "--pp", "8", "--gbs", "1024"])
    assert code == 0 and [v["status"] for v in out["verdicts"]] == [PASS] * 5


def test_tp_above_node_fails(capsys):
    code, out = run_json(capsys, [*GPT3, "--tp", "16", "--pp", "8", "--gbs", "1024"])
    q1 = out["verdicts"][0]
    assert code == 3 and q1["status"] == FAIL and "above 8 GPUs per node" in q1["summary"]


def test_island_crossing():
    model = presets.load_model("mixtral-8x7b")
    plan = dse.Plan.make(tp=1, pp=4, ep=8, mbs=1, gbs=1024)
    # EP 8 at stride 1 spans 8 ranks: islands of 4 put the MoE all-to-all on the core (seed 001 failure mode)
    c4 = presets.load_cluster("seed", island_gpus=4, oversubscription=3)
    v = check.four_questions(model, c4, plan)["verdicts"][1]
    assert v.status == FAIL and "EP" in v.summary and "MoE" in v.summary
    # islands of 32: EP (8) and PP (span 32) inside, only DP crosses: PASS
    c32 = presets.load_cluster("seed", island_gpus=32, oversubscription=3)
    assert check.four_questions(model, c32, plan)["verdicts"][1].status == PASS
    # islands of 16: PP (stride 8 x 4 = span 32) crosses: WARN
    c16 = presets.load_cluster("seed", island_gpus=16)
    assert check.four_questions(model, c16, plan)["verdicts"][1].status == WARN


def test_dp_hiding_at_measured_busbw():
    # seed 001's arithmetic: ~2 x 14 GB a rank at 40 GB/s is ~0.7 s. Here Psi = 12 L h^2 = 6.44e9 (L 32, h 4096),
    # t = p = 1, d = 1024: 2 x 1023/1024 x 2 bytes x 6.44e9 = 25.74 GB a rank; at 40 GB/s 0.6435 s (rel 1e-3)
    model = presets.model_from_fields({"layers": 32, "hidden": 4096, "heads": 32, "seq": 2048})
    cluster = presets.load_cluster("seed")
    plan = dse.Plan.make(tp=1, pp=1, mbs=1, gbs=1024, zero=0)
    res = check.four_questions(model, cluster, plan, busbw_bytes_per_s=40e9)
    r = res["report"]
    assert float(r.traffic_bytes.dp) == pytest.approx(2 * 1023 / 1024 * 2 * 12 * 32 * 4096**2, rel=1e-9)
    assert float(r.wire_s.dp) == pytest.approx(0.6435, rel=1e-3)
    q3 = res["verdicts"][2]
    # compute by hand: (6 Psi B s + 12 L B s^2 h) / (N x 400 TFLOP/s) = (0.1980 + 0.0165) s = 0.2144 s;
    # window 2/3 of it = 0.1429 s (seed 000 sec.6), so 0.6435 - 0.1429 = 0.5006 s is exposed: FAIL
    assert float(r.compute_s) == pytest.approx(0.2144, rel=1e-3)
    assert float(r.exposed_s.dp) == pytest.approx(0.5006, rel=1e-3)
    assert q3.status == FAIL and "40 GB/s (--busbw)" in q3.summary
    # eight times the batch: compute 1.715 s, window 1.143 s; 0.6435 s is 56% of it: hidden with headroom, PASS
    big = check.four_questions(model, cluster, plan.replace(gbs=8192), busbw_bytes_per_s=40e9)
    assert float(big["report"].compute_s) == pytest.approx(8 * 0.2144, rel=1e-3)
    assert big["verdicts"][2].status == PASS and "56% of the window" in big["verdicts"][2].summary


def test_microbatch_rule(capsys):
    # seed 001: "Four stages with eight microbatches": m = 8 < 4p = 16 -> WARN; bubble 3/8 of compute
    code, out = run_json(capsys, [*GPT3, "--tp", "8", "--pp", "4", "--gbs", "256"])   # d = 32, m = 8
    q4 = out["verdicts"][3]
    assert q4["status"] == WARN and "m = 8, p = 4" in q4["summary"] and "37.5% of compute" in q4["summary"]
    code, out = run_json(capsys, [*GPT3, "--tp", "8", "--pp", "8", "--gbs", "64"])    # d = 16, m = 4 < p
    assert out["verdicts"][3]["status"] == FAIL and code == 3


def test_exit_codes():
    assert exit_code([PASS, PASS]) == 0 and exit_code([PASS, WARN]) == 1 and exit_code([WARN, FAIL]) == 3
    assert main(["check", *GPT3, "--tp", "8", "--pp", "8", "--gbs", "1024", "--busbw", "fast"]) == 2


def test_interleaved_ranks_fail_q1(capsys):
    # seed 001 failure mode: a scheduler that deals consecutive ranks to different nodes splits every TP group
    code, out = run_json(capsys, [*GPT3, "--tp", "8", "--pp", "8", "--gbs", "1024", "--assign", "round-robin"])
    assert code == 3 and out["verdicts"][0]["status"] == FAIL and "128 of 128 TP groups" in out["verdicts"][0]["summary"]


def test_dp_question_names_hybrid_sharding(capsys):
    # Plan.dp_shard: the DP question says what the sync is (sharded over 128, all-reduced across 4)
    code, out = run_json(capsys, ["--preset", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "512", "--tp", "1",
                                  "--mbs", "2", "--gbs", "1024", "--zero", "3", "--dp-shard", "128"])
    assert ("hybrid sharding: sharded over 128 (scale-out), all-reduced across 4 groups (scale-out)"
            in out["verdicts"][2]["summary"])
    # each group where its ranks sit (TP 1, 8 GPUs a node): a shard group of 8 neighbours inside a node,
    # its 64 replicas 8 ranks apart across nodes
    code, out = run_json(capsys, ["--preset", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "512", "--tp", "1",
                                  "--mbs", "2", "--gbs", "1024", "--zero", "3", "--dp-shard", "8"])
    assert ("hybrid sharding: sharded over 8 (scale-up), all-reduced across 64 groups (scale-out)"
            in out["verdicts"][2]["summary"])


def test_island_question_counts_hybrid_replicas_as_dp(capsys):
    # Q2 lays DP out as evaluate does: with hybrid sharding the replica group (r ranks s apart) is DP's,
    # so a shard group inside an island of 256 and replicas across islands is "only DP crosses"
    args = ["--preset", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "512", "--island", "256", "--oversub", "4", "--tp", "8",
            "--mbs", "1", "--gbs", "512", "--zero", "3", "--dp-shard", "32"]
    code, out = run_json(capsys, args)
    q2 = out["verdicts"][1]
    assert q2["status"] == PASS and "only DP crosses" in q2["summary"]
    # the shard group (32 DP ranks 8 apart: 256 ranks) stays in its island; the replica groups cross
    assert q2["details"] == ["DP's replica groups span 512 ranks, 6.111 s on the wire (all of DP)"]
