"""Selective recompute's modules (Plan.recompute_modules; Megatron-Core --recompute-modules,
TransformerConfig.recompute_modules: core_attn, layernorm, moe_act, mla_up_proj, mlp, moe, shared_experts).
What each frees and runs again, by hand for Qwen3-235B-A22B (hidden 4096, 94 layers, 128 experts of
width 1536 gated, top-8, no shared expert, GQA 64 x 128 with 4 kv heads) and Llama 3 8B (hidden 4096,
FFN 14336 gated, 32 x 128 heads, 8 kv heads)."""

import pytest

import dse
from dse.cli import main
from dse.errors import InputError
from dse.equations import memory, traffic
from dse.inputs import RECOMPUTE, RECOMPUTE_MODULES, checks, fidelity, presets
from dse.inputs.plan import module_names, recompute_name
from dse.ops import megatron

QWEN = presets.load_model("qwen3-235b-a22b")
LLAMA = presets.load_model("llama3-8b")
FID = fidelity.resolve("calibrated")
SEL = RECOMPUTE["selective"]
M = RECOMPUTE_MODULES


def _per_layer(model, modules, t=1.0, sp=1.0):
    return float(memory.activation_bytes_per_layer(model, t, 1.0, 1.0, SEL, sp, FID, 1.0, modules=modules))


def test_layernorm_and_moe_act_free_the_norm_outputs_and_the_experts_fc2_input():
    # the ModelZoo's 'norm, act' (layernorm moe_act): per token the two norm outputs 2 x 2h and the routed
    # experts' activation output, the FC2 input of each of the top-8 copies, 8 x 2 x 1536 bytes
    s, h = float(QWEN.seq), 4096
    freed = _per_layer(QWEN, M["core_attn"]) - _per_layer(QWEN, M["core_attn"] + M["layernorm"] + M["moe_act"])
    assert freed == pytest.approx(s * (2 * 2 * h + 8 * 2 * 1536), rel=1e-12)
    # at TP 4 with SP both split four ways (sequence-wise and TP-wise alike)
    freed4 = (_per_layer(QWEN, M["core_attn"], t=4.0)
              - _per_layer(QWEN, M["core_attn"] + M["layernorm"] + M["moe_act"], t=4.0))
    assert freed4 == pytest.approx(freed / 4, rel=1e-12)


def test_moe_frees_the_dispatched_copies_and_every_routed_tensor_once():
    # moe: the 8 dispatched copies of the FFN input 8 x 2h and the gate, up and FC2 inputs 3 x 8 x 2 x 1536
    s, h = float(QWEN.seq), 4096
    routed = 8 * 2 * h + 3 * 8 * 2 * 1536
    base = _per_layer(QWEN, M["core_attn"])
    assert base - _per_layer(QWEN, M["core_attn"] + M["moe"]) == pytest.approx(s * routed, rel=1e-12)
    # moe_act frees a part of what moe frees: together no more than moe alone
    assert _per_layer(QWEN, M["core_attn"] + M["moe"] + M["moe_act"]) == pytest.approx(
        _per_layer(QWEN, M["core_attn"] + M["moe"]), rel=1e-12)
    # a dense model has no experts: moe, moe_act, shared_experts free nothing; mlp frees gate, up, FC2 input
    dense = _per_layer(LLAMA, M["core_attn"])
    assert _per_layer(LLAMA, M["core_attn"] + M["moe"] + M["moe_act"] + M["shared_experts"]) == dense
    assert dense - _per_layer(LLAMA, M["core_attn"] + M["mlp"]) == pytest.approx(
        float(LLAMA.seq) * 3 * 2 * 14336, rel=1e-12)


def test_core_attn_is_the_default_and_without_it_the_scores_stay():
    # Megatron's default ["core_attn"] is Korthikanti's selective recompute: dse's default modules
    assert dse.Plan.make(tp=1, pp=1, mbs=1, gbs=1).recompute_modules == M["core_attn"]
    # without core_attn FlashAttention's fp32 logsumexp stays (4 bytes a head a token) and the core is not rerun
    assert _per_layer(LLAMA, 0.0) - _per_layer(LLAMA, M["core_attn"]) == pytest.approx(
        float(LLAMA.seq) * 4 * 32, rel=1e-12)
    assert float(memory.attention_core_recomputes(SEL, FID, 1.0, 0.0)) == 0.0
    assert float(memory.attention_core_recomputes(SEL, FID, 1.0, M["core_attn"])) == float(FID.selective_attn_recompute)


def test_mlp_reruns_the_dense_ffn_gemms_and_its_tp_pair():
    # Llama 3 8B: attention 4096 x (4096 + 2 x 1024) + 4096 x 4096 = 41.94M, FFN 3 x 4096 x 14336 = 176.16M
    attn, mlp = 4096 * (4096 + 2 * 1024) + 4096 * 4096, 3 * 4096 * 14336
    share = float(memory.recomputed_gemm_share(LLAMA, SEL, FID, 1.0, M["core_attn"] + M["mlp"]))
    assert share == pytest.approx(mlp / (attn + mlp), rel=1e-12)
    assert float(memory.recomputed_gemm_share(LLAMA, SEL, FID, 1.0, M["core_attn"])) == 0.0
    # TP: 4 all-reduce equivalents a layer a microbatch (2 forward, 2 backward); the FFN's forward pair again: 5
    blocks, moe = memory.module_rerun_blocks(LLAMA, SEL, M["core_attn"] + M["mlp"], FID)
    assert (float(blocks), float(moe)) == (32.0, 0.0)
    plain = traffic.tp(LLAMA, 2.0, 1.0, 1.0, 32.0, 4.0, SEL, 1.0)
    again = traffic.tp(LLAMA, 2.0, 1.0, 1.0, 32.0, 4.0, SEL, 1.0, rerun_blocks=float(blocks))
    assert float(again["bytes"]) / float(plain["bytes"]) == pytest.approx(5 / 4, rel=1e-12)


def test_moe_reruns_the_experts_and_their_all_to_alls():
    # Qwen3-235B-A22B: all 94 layers MoE, active weights a layer: attention 4096 x (64 x 128 + 2 x 4 x 128)
    # + 64 x 128 x 4096 and 8 routed experts of 3 x 4096 x 1536
    attn = 4096 * (64 * 128 + 2 * 4 * 128) + 64 * 128 * 4096
    routed = 8 * 3 * 4096 * 1536
    share = float(memory.recomputed_gemm_share(QWEN, SEL, FID, 1.0, M["moe"]))
    assert share == pytest.approx(routed / (attn + routed), rel=1e-12)
    # the dispatch and combine of the forward again: 4 all-to-alls a layer become 6 (x1.5, as full recompute)
    _, moe = memory.module_rerun_blocks(QWEN, SEL, M["moe"], FID)
    plain = traffic.ep(QWEN, 1.0, 8.0, 1.0, 12.0, 4.0, SEL, 8.0)
    again = traffic.ep(QWEN, 1.0, 8.0, 1.0, 12.0, 4.0, SEL, 8.0, rerun=float(moe))
    assert float(again["calls"]) / float(plain["calls"]) == pytest.approx(1.5, rel=1e-12)
    # folded EP (whole experts): no TP pair around the MoE block to run again
    assert float(memory.module_rerun_blocks(QWEN, SEL, M["moe"], FID, folded=1.0)[0]) == 0.0


def test_the_ops_that_run_again_write_their_outputs_again():
    # layernorm + moe_act at t = 1: the norm outputs 2 x 2h and the routed activation output 8 x 2 x 1536 a token
    got = float(memory.rerun_elementwise_bytes(QWEN, 1.0, 1.0, 1.0, 1.0, SEL, M["layernorm"] + M["moe_act"], FID, 1.0))
    assert got == pytest.approx(float(QWEN.seq) * (4 * 4096 + 8 * 2 * 1536), rel=1e-12)
    assert memory.rerun_elementwise_bytes(QWEN, 1.0, 1.0, 1.0, 1.0, RECOMPUTE["full"], M["layernorm"], FID) == 0.0


def test_the_modelzoo_modules_on_its_own_plan():
    # The Megatron-MoE-ModelZoo runs Qwen3-235B-A22B on 256 H100 at TP 2 x PP 8 x VPP 4 x EP 32 folded with
    # 'norm, act' recomputed (judged_moe_modelzoo_h100.csv R166). Against no recompute the first stage's
    # activations shrink by its in-flight layers times the by-hand bytes above (at t = 2), and the step
    # grows by the norms and the activation run again
    cl = presets.load_cluster("dgx-h100").replace(gpus=256.0)
    kw = dict(tp=2, pp=8, vpp=4, ep=32, etp=1, mbs=1, gbs=2048, zero=1, sp=1, flash_attention=1,
              embedding_in_split=1, loss_in_split=1)
    none = dse.evaluate(QWEN, cl, dse.Plan.make(**kw, recompute=RECOMPUTE["none"]), "calibrated")
    zoo = dse.evaluate(QWEN, cl, dse.Plan.make(**kw, recompute=SEL, recompute_modules=M["layernorm"] + M["moe_act"]),
                       "calibrated")
    assert float(zoo.step_s) > float(none.step_s)
    freed = (float(memory.activation_bytes_per_layer(QWEN, 2.0, 1.0, 1.0, RECOMPUTE["none"], 1.0, FID, 1.0))
             - _per_layer(QWEN, M["layernorm"] + M["moe_act"], t=2.0))
    assert freed == pytest.approx(float(QWEN.seq) * (2 * 2 * 4096 + 8 * 2 * 1536) / 2, rel=1e-12)
    # first stage: min(p, m) = 8 microbatches in flight of its 11 layers (94 layers + embedding + loss = 96
    # units, 3 a virtual stage: its first chunk holds the embedding and 2 layers, then 3 x 3), x (1 + 7/32)
    # for interleaving over 4 chunks (Korthikanti sec.4.2.3)
    acts = lambda r: float(r.activations_bytes)  # noqa: E731
    assert acts(none) - acts(zoo) == pytest.approx(8 * 11 * freed * (1 + 7 / 32), rel=1e-9)


def test_names_codes_and_bad_input():
    assert checks.plan_value("--recompute-modules", "layernorm,moe_act") == 6.0
    assert checks.plan_value("plan.recompute_modules", ["layernorm", "moe_act", "layernorm"]) == 6.0
    assert checks.plan_value("--recompute-modules", "5") == 5.0
    assert module_names(6.0) == ["layernorm", "moe_act"]
    assert recompute_name(SEL, 1.0, 6.0) == "selective (layernorm, moe_act)"
    assert recompute_name(SEL, 1.0, M["core_attn"]) == "selective"
    with pytest.raises(InputError, match="recompute-modules: 'norm' is not allowed; allowed: any of core_attn"):
        checks.plan_value("--recompute-modules", "norm")
    with pytest.raises(InputError, match="'128' is not allowed"):
        checks.plan_value("--recompute-modules", "128")


def test_cli_bad_modules_is_one_line_exit_2(capsys):
    assert main(["plan", "--preset", "llama3-8b", "--recompute-modules", "act"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--recompute-modules: 'act' is not allowed" in err[0]


def test_megatron_lines_carry_the_modules_both_ways():
    line = ("--tensor-model-parallel-size 2 --micro-batch-size 1 --recompute-granularity selective "
            "--recompute-modules layernorm moe_act --moe-grouped-gemm --num-experts 8 --moe-router-topk 2 --bf16")
    plan = megatron.parse(line)["plan"]
    assert plan["recompute"] == "selective" and plan["recompute_modules"] == 6
    # no --recompute-modules: Megatron's default ["core_attn"]
    assert megatron.parse("--micro-batch-size 1 --recompute-granularity selective")["plan"]["recompute_modules"] == 1
    model = megatron.model_dict(presets.load_model("mixtral-8x7b"))
    pairs, _ = megatron.flags(dict(megatron.plan_dict(dse.Plan.make(tp=2, pp=1, mbs=1, gbs=64)),
                                   recompute="selective", recompute_modules=6), model)
    assert ("--recompute-modules", ["layernorm", "moe_act"]) in pairs
    assert "--recompute-modules layernorm moe_act" in "\n".join(megatron.torchrun_lines(1, 8, pairs))
    # a dense model has no moe_act: left out with a note (Megatron refuses it without grouped GEMMs)
    dense = megatron.model_dict(LLAMA)
    pairs, notes = megatron.flags(dict(megatron.plan_dict(dse.Plan.make(tp=2, pp=1, mbs=1, gbs=64)),
                                       recompute="selective", recompute_modules=6), dense)
    assert ("--recompute-modules", ["layernorm"]) in pairs and any("moe_act left out" in n for n in notes)
    with pytest.raises(InputError, match="--megatron-args: --recompute-modules: 'attn' is not allowed"):
        megatron.parse("--micro-batch-size 1 --recompute-granularity selective --recompute-modules attn")
    # Megatron-Core's TransformerConfig field, a list
    cfg = megatron.mcore_config([("--recompute-granularity", "selective"), ("--recompute-modules", ["moe_act"])])
    assert cfg["TransformerConfig"]["recompute_modules"] == ["moe_act"]
    assert ("--recompute-modules", ["moe_act"]) in megatron.mcore_flags(cfg)


def test_the_long_context_sweep_runs_alike_on_both_engines():
    # sweeps/moe-long-context-qwen3.toml (TP x CP x EP x recompute modules, Qwen3-235B-A22B at 128K tokens):
    # the compiled kernel and the host engine give the same plans at the same step times; its header's
    # figures: only 'layernorm moe' fits, TP 2 x CP 16 x EP 8 best at 297.0 s, the team's TP 4 x CP 8 x EP 8
    # 298.2 s
    from tests.helpers import sweep_on_both_engines

    feasible, rows, best = sweep_on_both_engines("moe-long-context-qwen3", ("tp", "cp", "ep", "recompute_modules"))
    assert feasible == 9
    assert {k[3] for k, _ in rows} == {"layernorm moe"}     # the point names the set as the file does
    assert rows[0] == ((2, 16, 8, "layernorm moe"), pytest.approx(297.013, abs=5e-3))
    assert best[(4, 8, 8, "layernorm moe")] == pytest.approx(298.184, abs=5e-3)


def test_cli_notes_modules_without_selective_recompute(capsys):
    # Megatron ignores --recompute-modules unless the granularity is selective; dse plan says so, once
    assert main(["plan", "--preset", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--tp", "1", "--pp", "1",
                 "--gbs", "8", "--recompute", "full", "--recompute-modules", "layernorm"]) == 0
    err = capsys.readouterr().err
    assert err.count("--recompute-modules is what selective recompute recomputes") == 1


def test_mla_up_proj_reruns_the_up_projections_by_hand():
    # DeepSeek-V3 (config.json): a layer's query up-projection 1536 x 128 x 192 and key/value up-projection
    # 512 x 128 x (128 + 128), over a step's layer GEMM weights: 61 MLA blocks (h x 1536 + 1536 x 128 x 192
    # + h x (512 + 64) + 512 x 128 x 256 + 128 x 128 x h), 3 dense SwiGLU FFNs of 18432 and 58 MoE layers of
    # 8 routed + 1 shared experts of 2048 (h = 7168)
    v3 = presets.load_model("deepseek-v3")
    h = 7168
    up = 1536 * 128 * 192 + 512 * 128 * 256
    attn = h * 1536 + 1536 * 128 * 192 + h * (512 + 64) + 512 * 128 * 256 + 128 * 128 * h
    total = 61 * attn + 3 * 3 * h * 18432 + 58 * 9 * 3 * h * 2048
    got = float(memory.module_gemm_share(v3, M["mla_up_proj"], FID))
    assert got == pytest.approx(61 * up / total, rel=1e-12)
    # and they free Q, K and V: 2 x 128 x 192 twice and 2 x 128 x 128 a token (t = 1)
    assert _per_layer(v3, M["core_attn"]) - _per_layer(v3, M["core_attn"] + M["mla_up_proj"]) == pytest.approx(
        float(v3.seq) * (4 * 128 * 192 + 2 * 128 * 128), rel=1e-12)
    # a model without MLA has no up-projections: nothing reruns, nothing is freed
    assert float(memory.module_gemm_share(LLAMA, M["mla_up_proj"], FID)) == 0.0
    assert _per_layer(LLAMA, M["core_attn"] + M["mla_up_proj"]) == _per_layer(LLAMA, M["core_attn"])
