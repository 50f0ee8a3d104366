"""MoE as it costs (issue 17 item 1): grouped GEMMs at per-expert token counts, dispatch and
combine at measured all-to-all rates, node-limited routing counted in expert groups."""

import pytest

import dse
from dse.equations import compute
from dse.inputs import presets
from dse.inputs.fidelity import Fidelity

V3 = presets.load_model("deepseek-v3")     # 256 routed experts, top-8, expert width 2048, h 7168
H800 = presets.load_cluster("h800")        # NVLink 160 GB/s, IB 50 GB/s a GPU (DeepSeek-V3 sec.3.2.2)


def test_tokens_per_expert_by_hand():
    # A rank's 4096 tokens (b 1, s 4096) x top-8 from each of e ranks over 256 experts:
    # EP 64: 4096 x 8 x 64 / 256 = 8192 rows an expert; EP 8: 1024. Mixtral (8 experts, top-2)
    # at EP 8: 4096 x 2 = 8192. Dense: the tokens themselves.
    assert float(compute.tokens_per_expert(4096.0, 8.0, 64.0, 256.0)) == 8192
    assert float(compute.tokens_per_expert(4096.0, 8.0, 8.0, 256.0)) == 1024
    assert float(compute.tokens_per_expert(4096.0, 2.0, 8.0, 8.0)) == 8192
    assert float(compute.tokens_per_expert(4096.0, 1.0, 1.0, 1.0)) == 4096


def test_grouped_gemm_runs_at_the_per_expert_shape():
    # The routed expert's up GEMM at EP 8: m = 1024 rows, n = 2 x 2048 (gated), k = 7168:
    # I = m n k / (mn + nk + mk) = 735.18 FLOP/byte in bf16 (by hand). Through the one GEMM
    # curve with knee 0.62, exponent 1.07, t0 5.78 us at 709 TFLOP/s: H800 balance 989/3.35 =
    # 295.2 FLOP/B, (0.62 x 295.2 / 735.18)^1.07 = 0.2259, t0 term 5.78e-6 x 709e12 /
    # (2 x 1024 x 4096 x 7168) = 0.0682: efficiency 1 / 1.2940 = 0.7728.
    fid = Fidelity.make(gemm_shape=1.0, gemm_knee=0.62, gemm_exponent=1.07, gemm_overhead_s=5.78e-6, real_shapes=1.0)
    I = compute.gemm_intensity(1024.0, 4096.0, 7168.0, 2.0)
    assert float(I) == pytest.approx(735.1795, rel=1e-6)
    eff = compute.gemm_efficiency(I, 989e12 / 3.35e12, 2.0 * 1024 * 4096 * 7168, 709e12, fid)
    assert float(eff) == pytest.approx(0.7728, abs=1e-4)
    # The whole layer mix is slower per FLOP at EP 8 (1024 rows an expert) than at EP 64 (8192),
    # and only T k e / E matters: twice the experts over twice the ranks is the same GEMM.
    args = (1.0, 1.0, 1.0, 989e12 / 3.35e12, 2.0, 709e12, fid)
    e8 = float(compute.layer_gemm_efficiency(V3, 1.0, 1.0, 8.0, *args[2:]))
    e64 = float(compute.layer_gemm_efficiency(V3, 1.0, 1.0, 64.0, *args[2:]))
    twice = float(compute.layer_gemm_efficiency(V3.replace(experts=512.0), 1.0, 1.0, 128.0, *args[2:]))
    assert e8 < e64 and twice == pytest.approx(e64, rel=1e-12)


def test_ep_alltoall_runs_at_its_own_rate():
    # EP 64 over 8 nodes (DeepSeek-V3's layout): the all-to-all crosses IB; at half the
    # measured scale-out share its wire time (latency off) doubles, other groups stay.
    plan = dse.Plan.make(tp=1, pp=16, ep=64, mbs=1, gbs=4096)
    full = dse.evaluate(V3, H800, plan, Fidelity.make(real_shapes=1.0))
    half = dse.evaluate(V3, H800, plan, Fidelity.make(real_shapes=1.0, a2a_out_efficiency=0.5))
    assert float(half.wire_s.ep) == pytest.approx(2 * float(full.wire_s.ep), rel=1e-12)
    assert float(half.wire_s.pp) == float(full.wire_s.pp) and float(half.wire_s.dp) == float(full.wire_s.dp)


def test_node_limit_counts_expert_groups():
    # DeepSeek-V3 config.json: topk_group 4 of n_group 8. EP 64 on 8 nodes: a group is a node,
    # at most 4 nodes. EP 256 on 32 nodes: a group spans 32/8 = 4 nodes, so 4 groups may reach
    # 16, and top-8 hits only 32 (1 - (31/32)^8) = 7.1776 distinct nodes on average: the limit
    # no longer binds, 7.1776 / 4 the scale-out bytes of reading the limit as 4 nodes.
    fid = Fidelity.make(real_shapes=1.0)
    cl = H800.replace(gpus=2048.0)
    plan = dse.Plan.make(tp=1, pp=8, ep=256, mbs=1, gbs=4096)
    grouped = float(dse.evaluate(V3, cl, plan, fid).scale_out_bytes.ep)
    as_nodes = float(dse.evaluate(V3.replace(route_groups=0.0), cl, plan, fid).scale_out_bytes.ep)
    assert grouped / as_nodes == pytest.approx(32 * (1 - (31 / 32) ** 8) / 4, rel=1e-9)
    plan64 = dse.Plan.make(tp=1, pp=16, ep=64, mbs=1, gbs=4096)
    assert float(dse.evaluate(V3, H800, plan64, fid).scale_out_bytes.ep) == pytest.approx(
        float(dse.evaluate(V3.replace(route_groups=0.0), H800, plan64, fid).scale_out_bytes.ep), rel=1e-12)


def test_deepseek_v2_reads_device_limited_routing():
    # DeepSeek-V2 config.json: n_group 8, topk_group 3 (sec.2.2.2: M = 3).
    v2 = presets.load_model("deepseek-v2")
    assert float(v2.route_node_limit) == 3 and float(v2.route_groups) == 8


def test_fp8_dispatch_sends_the_forward_dispatch_in_fp8():
    # Of a MoE layer's four all-to-alls (dispatch + combine forward, the mirrored pair backward),
    # DeepEP's FP8 dispatch sends the forward dispatch as FP8 plus an fp32 scale per 128 channels,
    # 1 + 4/128 = 1.03125 bytes a value against 2: (3 + 1.03125/2) / 4 = 0.87890625 of the 16-bit
    # volume. Full recompute repeats the forward pair: (4 + 2 x 0.515625) / 6 = 0.83854166...
    model = presets.load_model("mixtral-8x7b")
    cluster = presets.load_cluster("h100-sxm").replace(gpus=64.0)
    fid = dse.inputs.fidelity.calibrated()

    def ep_bytes(recompute, on):
        plan = dse.Plan.make(tp=1, pp=1, ep=8, mbs=1, gbs=64, zero=1, recompute=dse.RECOMPUTE[recompute],
                             ep_fp8_dispatch=on)
        r = dse.evaluate(model, cluster, plan, fid)
        return float(r.scale_up_bytes.ep) + float(r.scale_out_bytes.ep)

    assert ep_bytes("none", 1.0) / ep_bytes("none", 0.0) == pytest.approx(0.87890625, rel=1e-12)
    assert ep_bytes("full", 1.0) / ep_bytes("full", 0.0) == pytest.approx(5.03125 / 6.0, rel=1e-12)
