"""Calibrated mode: published FLOP conventions, schedules, latency, and the shipped calibration."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dse
from dse.calibration import fit as calibrated, validate as validation
from dse.engines.compiled import COMPILE_FIRST, compile_lowered
from dse.equations import collectives as col, compute, schedule
from dse.inputs import fidelity, presets
from dse.cli import main


@pytest.fixture(scope="module")
def runs():
    rs, _ = validation.load_runs()
    return {r.row_id: r for r in rs}


def _report(run, fid="calibrated"):
    return dse.evaluate(run.model, run.cluster, run.plan, fid)


def test_narayanan_eq3_reproduces_printed_tflops(runs):
    # Narayanan et al. 2021 eq.(3), Table 1 GPT 1T: F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))
    # over 3072 GPUs in 102.63 s gives the printed 163 TFLOP/s (printed to 3 figures).
    B, s, L, h, V, N, t = 3072, 2048, 128, 25600, 51200, 3072, 102.63
    F = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    # dse's calibrated hardware FLOPs (real shapes, full recompute) are that formula exactly, so
    # dse's FLOPs over the published time give the printed throughput.
    rep = _report(runs["R010"])
    assert float(rep.hardware_flops) == pytest.approx(F, rel=1e-12)
    assert float(rep.hardware_flops) / (N * t) / 1e12 == pytest.approx(163, rel=5e-3)
    # The row's TFLOP/s convention is read from its own text (tflops_kind), not from its source id:
    # issue 12 removed validation.source_flops(source_id, ...), which branched on the id.
    row = next(r for r in validation.read_rows() if r["row_id"] == "R010")
    assert validation.convention(row) == "hardware"


def test_korthikanti_514_mfu_for_175b(runs):
    # Korthikanti et al. 2022 Table 5: GPT-3 175B, SP + selective, 64 A100s, 13.75 s -> 51.4% MFU;
    # model FLOPs eq.(7) = 72 B L s h^2 (1 + s/(6h) + V/(12 h L)).
    B, L, s, h, V = 64, 96, 2048, 12288, 51200
    model_flops = 72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    rep = _report(runs["R026"])
    assert float(rep.model_flops) == pytest.approx(model_flops, rel=1e-12)   # same convention
    # dse's model FLOPs over the published 13.75 s reproduce the printed MFU
    assert float(rep.model_flops) / (64 * 312e12 * 13.75) == pytest.approx(0.514, rel=2e-3)
    # R026 is a judged row (never fitted): the calibrated prediction is within 5%.
    assert float(rep.mfu) == pytest.approx(0.514, rel=0.05)


def test_interleaved_bubble():
    # Narayanan sec.2.2.2 (validation F18): (1/v)(p-1)/m.
    assert float(schedule.bubble_fraction(8.0, 64.0, 3.0)) == pytest.approx(7 / 192, rel=1e-12)
    model = presets.load_model("gpt3-175b")
    plan = dse.Plan.make(tp=8, pp=8, vpp=3, mbs=1, gbs=1024)
    rep = dse.evaluate(model, presets.load_cluster("seed"), plan, "calibrated")
    assert float(rep.bubble_fraction) == pytest.approx(7 / (3 * 64), rel=1e-12)
    # v times the point-to-point traffic (Narayanan sec.2.2.2).
    one = dse.evaluate(model, presets.load_cluster("seed"), plan.replace(vpp=1), "calibrated")
    assert float(rep.traffic_bytes.pp) == pytest.approx(3 * float(one.traffic_bytes.pp), rel=1e-12)


def test_zero_bubble_and_dualpipe_bubbles():
    # DeepSeek-V3 Table 2 with F = B_input = W (Zero Bubble sec.2), so F + B = 3W, F&B = F + B:
    # ZB1P (p-1)(F+B-2W) = (p-1) W; DualPipe (p/2-1)(F&B + B - 3W) = 2 (p/2-1) W; ideal m (F+B) = 3 m W.
    p, m = 8.0, 20.0
    assert float(schedule.bubble_fraction(p, m, 1.0, 1.0)) == pytest.approx(7 / 60, rel=1e-12)
    assert float(schedule.bubble_fraction(p, m, 1.0, 2.0)) == pytest.approx(2 * 3 / 60, rel=1e-12)
    assert float(schedule.bubble_fraction(p, m, 1.0, 0.0)) == pytest.approx(7 / 20, rel=1e-12)


def test_dualpipe_memory_doubles_weights():
    # DeepSeek-V3 Table 2: DualPipe keeps 2x parameters and PP + 1 microbatches of activations.
    model = presets.load_model("llama3-8b")
    plan = dse.Plan.make(tp=1, pp=4, mbs=1, gbs=256, zero=1)
    cl = presets.load_cluster("h100-sxm").replace(gpus=64)
    a = dse.evaluate(model, cl, plan, "calibrated")
    b = dse.evaluate(model, cl, plan.replace(schedule=2.0), "calibrated")
    assert float(b.weights_bytes) == pytest.approx(2 * float(a.weights_bytes), rel=1e-12)
    assert float(b.activations_bytes) > float(a.activations_bytes)


def test_latency_bound_small_bandwidth_bound_large():
    # alpha-beta (Thakur et al. 2005), 8-GPU ring all-reduce on A100 NVLink (300 GB/s), alpha 2.5 us:
    # 1 kB: 14 alpha = 35 us against 5.8 ns on the wire; 1 GB: 5.8 ms on the wire against 35 us.
    n, bw, alpha = 8.0, 300e9, 2.5e-6
    steps = col.ring_steps(col.ALL_REDUCE, n)
    for size, latency_share in ((1e3, (0.99, 1.0)), (1e9, (0.0, 0.01))):
        sent = size * col.ring_fraction(col.ALL_REDUCE, n)
        total = float(col.wire_time(sent, 1.0, steps, bw, alpha, 1.0))
        lat = float(col.wire_time(0.0, 1.0, steps, bw, alpha, 1.0))
        assert latency_share[0] <= lat / total <= latency_share[1]
    # nccl-tests on Azure ND A100 v4 (collective_bandwidth.csv C001): 1 kB busbw 0.04 GB/s; the
    # calibrated alpha (preset) predicts it within a factor of 2.
    cl = presets.load_cluster("a100-80gb")
    fid = fidelity.calibrated()
    t = float(col.wire_time(1e3 * 1.75, 1.0, steps, 300e9 * float(fid.bw_up_efficiency), cl.alpha_up_s, 1.0))
    assert 0.02e9 <= 1e3 * 1.75 / t <= 0.08e9


def test_seed_fidelity_switches_everything_off():
    # Every calibrated knob has a seed value that leaves seed 000's simulator exact.
    seed = dse.Fidelity.seed()
    for name in ("real_shapes", "latency", "gemm_shape", "selective_attn_recompute", "zero3_microbatch",
                 "tp_comm_overlap", "elementwise_passes", "optimizer_step", "memory_buffers",
                 "memory_fragmentation", "fused_attn_efficiency"):
        assert float(getattr(seed, name)) == 0.0
    for name in ("attn_efficiency", "fp8_efficiency", "bw_up_efficiency", "bw_out_efficiency", "flops_efficiency"):
        assert float(getattr(seed, name)) == 1.0
    # The new presets' HBM bandwidth and FP8 peak do not move seed mode (only calibrated uses them).
    model, plan = presets.load_model("gpt3-175b"), dse.Plan.make(tp=8, pp=8, mbs=1, gbs=1024)
    a = dse.evaluate(model, presets.load_cluster("dgx-h100"), plan)
    b = dse.evaluate(model, presets.load_cluster("h100-sxm").replace(alpha_up_s=0.0, alpha_out_s=0.0), plan)
    assert float(b.step_s) == pytest.approx(float(a.step_s), rel=1e-12)


def test_calibrated_vmap_and_jit_match_a_loop(runs):
    rows = [runs[k] for k in ("R002", "R012", "R026", "R079")]
    model, cluster, plan = validation.batch(rows)
    fid = fidelity.calibrated()
    # one program, jitted and vmapped (an eager vmap compiled every op's shapes: 158 compiles), compiled
    # compile-first as tests/test_evaluate_invariants.py's is
    mapped = compile_lowered(jax.jit(jax.vmap(lambda m, c, p: dse.evaluate(m, c, p, fid).step_s)).lower(model, cluster, plan),
                             COMPILE_FIRST)(model, cluster, plan)
    loop = [float(_report(r, fid).step_s) for r in rows]
    np.testing.assert_allclose(np.asarray(mapped), loop, rtol=1e-12)


def test_gradient_fit_moves_toward_the_runs(runs):
    # dse calibrate's fit: Adam through evaluate lowers the squared log error of iteration time.
    rows = [runs[k] for k in ("R001", "R025", "R029")]
    model, cluster, plan = validation.batch(rows)
    base = {**fidelity.SWITCHES, **fidelity.load_params(), "flops_efficiency": 0.4}
    times = [r.time_s for r in rows]
    fitted, rmse = calibrated.fit_runs(model, cluster, plan, times, base, steps=40, names=("flops_efficiency",))
    start = dse.evaluate(model, cluster, plan, dse.Fidelity.make(**base)).step_s
    rmse0 = float(jnp.sqrt(jnp.mean((jnp.log(start) - jnp.log(jnp.asarray(times))) ** 2)))
    assert rmse < 0.5 * rmse0
    assert fitted["flops_efficiency"] > 0.5


def test_gemm_efficiency_falls_with_per_rank_shape():
    # cuBLASLt on A100 (kernel_microbenchmarks.csv K001-K005): 1024^3 reaches 119 TFLOP/s, 16384^3 256.
    fid = fidelity.calibrated()
    cl = presets.load_cluster("a100-80gb")
    balance = float(cl.peak_flops_per_s / cl.hbm_bw_bytes_per_s)
    def eff(n):
        return float(compute.gemm_efficiency(compute.gemm_intensity(n, n, n, 2.0), balance, 2.0 * n ** 3,
                                             312e12 * 0.794, fid))
    assert eff(1024) < eff(4096) < eff(16384) <= 1.0
    assert 0.794 * eff(1024) * 312 == pytest.approx(119.4, rel=0.25)
    assert 0.794 * eff(16384) * 312 == pytest.approx(256.5, rel=0.05)


def test_korthikanti_memory_first_stage(runs):
    # Korthikanti eq.(5)-(6) and sec.4.2.3/4.3 (validation F05, F08, F09): GPT-3 175B, t = 8,
    # p = 8, v = 3, SP + selective, b = 1: the first stage holds p microbatches of L/p layers at
    # 34 sbh/t each, x (1 + (p-1)/(p v)), plus the embedding output s b h p / t.
    rep = _report(runs["R026"])
    s, b, h, L, t, p, v = 2048, 1, 12288, 96, 8, 8, 3
    expect = s * b * h * L / t * 34 * (1 + (p - 1) / (p * v)) + s * b * h * p / t
    assert float(rep.activations_bytes) == pytest.approx(expect, rel=0.03)


def test_validate_cli_summary(capsys):
    assert main(["validate"]) == 0
    out = capsys.readouterr().out
    assert "judged (never fitted)" in out and "fitted rows:" in out
    table = validation.compare(*_runs_and_fid())
    judged = table["summary"]["judged (never fitted)"]
    assert judged["rows"] >= 15
    # Issue 4/12 targets on rows the fit never saw: median |error| <= 5% (met), max <= 15% (not met
    # since fused attention runs at its measured kernel rate: the worst judged rows are NeMo's FP8
    # H100 runs, R083 Nemotron-8B +17%, for which dse has no FP8 cast term; validation/README.md).
    assert judged["median_abs"] <= 0.05 and judged["max_abs"] <= 0.18


def _runs_and_fid():
    rs, _ = validation.load_runs()
    return rs, fidelity.calibrated(), fidelity.fitted_rows()


def test_validate_bad_csv_is_one_line(tmp_path, capsys):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dse: error: runs CSV") and err.count("\n") == 1


def test_korthikanti_appendix_b_output_deallocation(runs):
    # Korthikanti App.B (validation F11): deallocating pipeline outputs saves s b h p 16-bit
    # values on the first stage, 2.73 GB for 530B (s = 2048, b = 1, h = 20480, p = 35), printed
    # in GiB: 2 x 2048 x 20480 x 35 bytes = 2.73 GiB. Pinned within 3%.
    run = runs["R028"]
    kept = dse.evaluate(run.model, run.cluster, run.plan.replace(keep_stage_outputs=1.0), "calibrated")
    freed = _report(run)
    assert (float(kept.activations_bytes) - float(freed.activations_bytes)) / 2 ** 30 == pytest.approx(2.73, rel=0.03)


def test_fused_attention_work_is_what_the_flashattention_benchmark_counts():
    # Dao-AILab/flash-attention benchmarks/benchmark_flash_attention.py: fwd + bwd = 3.5 x 4 b s^2 a d,
    # halved when causal (the backward recomputes the scores: 5 s^2 matmuls for the 4 of 12 L B s^2 h).
    # Its Azure run (kernel_microbenchmarks.csv K047): dim 2048, head dim 128 (16 heads), batch 2, seq 8192.
    b, s, a, d = 2, 8192, 16, 128
    bench = 3.5 * 4 * b * s ** 2 * a * d / 2
    model = presets.load_model("llama2-7b").replace(layers=1.0, hidden=2048.0, heads=16.0, kv_heads=16.0, seq=8192.0)
    count = float(compute.attention_flops(model, b, fidelity.calibrated()))
    assert count == pytest.approx(12 * b * s ** 2 * a * d, rel=1e-12)
    assert count * compute.FUSED_ATTN_WORK == pytest.approx(bench, rel=1e-12)


def test_fused_attention_rate_comes_from_the_flashattention_rows():
    # K045/K047/K049: FlashAttention 2 fwd + bwd 179.5 (A100, peak 312), 327.9 (H100) and 329.3 (H200,
    # both peak 989) TFLOP/s; the fitted share is their geometric mean, (0.5753 x 0.3315 x 0.3330)^(1/3).
    params, report = calibrated.fit_attention(validation.load_attention())
    share = (179.5 / 312 * 327.9 / 989 * 329.3 / 989) ** (1 / 3)
    assert params["fused_attn_efficiency"] == pytest.approx(share, rel=1e-9)
    assert report["rows"] == 3 and report["share_a100-80gb"] == pytest.approx(179.5 / 312, rel=1e-9)
    assert fidelity.load_params()["fused_attn_efficiency"] == pytest.approx(share, rel=1e-9)   # shipped
    # The plan's flash_attention switch picks the rate; seed mode (share 0) keeps one rate for both.
    fid, peak = fidelity.calibrated(), 312e12
    assert float(compute.attention_rate(1.0, peak, fid)) == pytest.approx(peak * share / (7 / 12), rel=1e-9)
    unfused = peak * float(fid.flops_efficiency) * float(fid.attn_efficiency)
    assert float(compute.attention_rate(0.0, peak, fid)) == pytest.approx(unfused, rel=1e-12)
    seed = dse.Fidelity.seed()
    assert float(compute.attention_rate(1.0, peak, seed)) == float(compute.attention_rate(0.0, peak, seed)) == peak


def test_mpt_presets_match_the_benchmark_parameter_counts():
    # llm-foundry scripts/train/benchmarking/README.md NumParams at seq 2048 count the learned position
    # table (2048 h) besides 12 L h^2 per layer and the tied 50368 x h embedding (MPT yamls, 4h GELU FFN).
    published = {"mpt-1b": 1315950592, "mpt-3b": 2651837440, "mpt-7b": 6658859008, "mpt-13b": 12853954560,
                 "mpt-30b": 29975214080}
    fid = fidelity.calibrated()
    from dse.equations import memory
    for name, n in published.items():
        m = presets.load_model(name)
        total, _, _, _ = memory.param_counts(m, fid)
        assert float(total) == pytest.approx(n - 2048 * float(m.hidden), rel=2e-3), name


def test_mosaicml_row_reproduces_its_printed_mfu(runs):
    # R136: MPT-7b, seq 2048, 8 A100 80GB, GBS 96: 37130 tokens/s (4641 a GPU), MFU 64.23% against 312
    # with (6 N + 12 L h s) FLOPs a token, N = 6658859008 (the README's MFU formula and NumParams).
    r = runs["R136"]
    assert r.time_s == pytest.approx(96 * 2048 / 37130, rel=1e-12)
    mfu = (6 * 6658859008 + 12 * 32 * 4096 * 2048) * 4641 / 312e12
    assert 100 * mfu == pytest.approx(r.metric, abs=0.02) and r.metric_name == "MFU %"
    assert r.stack == "llm-foundry" and float(r.plan.zero) == 3.0 and float(r.plan.flash_attention) == 1.0


def test_h100_llmfoundry_rows_are_judged_only():
    # judged_mosaicml_h100.csv: the 11 single-node H100 rows of the same README (BF16 and FP8), never fitted.
    runs, skipped = validation.load_runs(validation.DEFAULT_DIR / "judged_mosaicml_h100.csv")
    assert len(runs) == 11 and not skipped
    assert not {r.row_id for r in runs} & set(fidelity.fitted_rows())
    assert {float(r.plan.fp8) for r in runs} == {0.0, 1.0} and all(r.stack == "llm-foundry" for r in runs)


def test_output_layer_runs_at_the_16_bit_rate_under_fp8():
    # Megatron-Core's output layer is a tensor_parallel.ColumnParallelLinear, not a Transformer Engine
    # FP8 layer: with fp8 on, the other GEMMs run at the FP8 rate, the logits at the 16-bit one (H100:
    # 1979 and 989 TFLOP/s dense, at the measured ceilings 0.7087 and 0.8033 of h100-sxm.toml over the
    # calibration's reference); p = 2 puts the logits on the last stage (x p / N).
    fid, cl = fidelity.calibrated(), presets.load_cluster("h100-sxm")
    eff, ref = float(fid.flops_efficiency), float(fid.matmul_ceiling)
    layers, logits, N, p = 8e15, 1e15, 8.0, 2.0
    t, _ = compute.step_compute_time(layers + logits, 0.0, logits, p, N, cl, 1.0, 1.0, fid)
    fp8_rate, rate16 = 1979e12 * 0.7087 / ref * eff, 989e12 * 0.8033 / ref * eff
    assert float(t) == pytest.approx(layers / (N * fp8_rate) + p * logits / (N * rate16), rel=1e-9)
    t16, _ = compute.step_compute_time(layers + logits, 0.0, logits, p, N, cl, 0.0, 1.0, fid)
    assert float(t16) == pytest.approx((layers + p * logits) / (N * rate16), rel=1e-9)


def test_gemm_rates_follow_each_accelerators_measured_matmul_ceiling():
    # compute.gemm_top_rates: a measured ceiling counts relative to the calibration's reference, the
    # geometric mean over the fitted runs' accelerators (fit.reference_ceiling); an accelerator without
    # one runs at the reference (its peak x 1), FP8 without its own at the 16-bit factor x fp8_efficiency.
    fid = fidelity.calibrated()
    ref, f8 = float(fid.matmul_ceiling), float(fid.fp8_efficiency)
    runs, _ = validation.load_runs()
    fitted = [r.cluster for r in runs if r.row_id in fidelity.fitted_rows()]
    # 21 fitted rows on A100 SXM (271.2 / 312 = 0.8692, the MAMF table), 6 on H100 SXM (794.5 / 989 = 0.8033)
    assert sorted({float(c.matmul_ceiling) for c in fitted}) == [0.8033, 0.8692]
    n_h100 = sum(float(c.matmul_ceiling) == 0.8033 for c in fitted)
    assert (len(fitted), n_h100) == (27, 6)
    assert ref == pytest.approx(math.exp((21 * math.log(0.8692) + 6 * math.log(0.8033)) / 27), rel=1e-12)
    assert calibrated.reference_share([c.matmul_ceiling for c in fitted]) == pytest.approx(ref, rel=1e-12)
    assert calibrated.reference_share([presets.load_cluster("h100-pcie").matmul_ceiling]) == 0.0
    top16, top8 = compute.gemm_top_rates(presets.load_cluster("h100-sxm"), fid)
    assert (float(top16), float(top8)) == pytest.approx((989e12 * 0.8033 / ref, 1979e12 * 0.7087 / ref), rel=1e-12)
    top16, top8 = compute.gemm_top_rates(presets.load_cluster("h100-pcie"), fid)     # nothing measured
    assert (float(top16), float(top8)) == pytest.approx((756e12, 1513e12 * f8), rel=1e-12)
    top16, top8 = compute.gemm_top_rates(presets.load_cluster("a100-80gb"), fidelity.Fidelity.seed())   # seed: peaks
    assert (float(top16), float(top8)) == (312e12, 0.0)


def test_flash_attention_2_kernels_follow_each_gpus_measured_share():
    # compute.flash_attn_scale: a FlashAttention-2-generation kernel (stack data attn_kernel_fa2) runs at the
    # pooled fused rate x its GPU's FA2 share (kernel_microbenchmarks.csv: A100 179.5 / 312 = 0.5753, H100
    # 327.9 / 989 = 0.3315) over the fitted runs' share: the table's only such runs are llm-foundry's on
    # A100 (R131-R139), so the reference is 0.5753 and an H100 runs at 0.3315 / 0.5753 = 0.5762 of it.
    fid = fidelity.calibrated()
    assert float(fid.flash_attn_share) == 0.5753
    runs, _ = validation.load_runs()
    users = [r for r in runs if r.row_id in fidelity.fitted_rows() and float(r.plan.attn_kernel_fa2) >= 1]
    assert {r.stack for r in users} == {"llm-foundry"} and {float(r.cluster.flash_attn_share) for r in users} == {0.5753}
    h100, a100, b200 = (presets.load_cluster(n) for n in ("h100-sxm", "a100-80gb", "b200"))
    assert float(compute.flash_attn_scale(h100, 1.0, fid)) == pytest.approx(0.3315 / 0.5753, rel=1e-12)
    assert float(compute.flash_attn_scale(a100, 1.0, fid)) == 1.0
    assert float(compute.flash_attn_scale(h100, 0.0, fid)) == 1.0           # cuDNN (Transformer Engine): pooled
    assert float(compute.flash_attn_scale(b200, 1.0, fid)) == 1.0           # not measured
    assert compute.flash_attn_scale(h100, 1.0, fidelity.Fidelity.seed()) == 1.0
    # the attention core's time scales by the inverse: 1e15 FLOPs of fused attention on 8 H100s
    t = [float(compute.step_compute_time(0.0, 1e15, 0.0, 1.0, 8.0, h100, 0.0, 1.0, fid, 1.0, None,
                                         compute.flash_attn_scale(h100, fa2, fid))[1]) for fa2 in (0.0, 1.0)]
    assert t[1] / t[0] == pytest.approx(0.5753 / 0.3315, rel=1e-12)
