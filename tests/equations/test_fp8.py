"""FP8 recipes end to end (issue 17 item 2): what delayed, tensorwise, MXFP8 and blockwise scaling
keep in memory, move on the wire and cast, each term pinned by hand from its stated source."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dse
from dse.equations import compute, memory, traffic
from dse.inputs import FP8_RECIPES, Fidelity, presets
from dse.inputs.fidelity import calibrated

ON = Fidelity.make(fp8_recipe_terms=1.0)          # the FP8 terms on, everything else at seed values
SEED = Fidelity.seed()
DELAYED, TENSORWISE, MXFP8, BLOCKWISE = (FP8_RECIPES[k] for k in ("delayed", "tensorwise", "mxfp8", "blockwise"))
F = lambda x: float(np.asarray(x))  # noqa: E731


def test_recipe_codes_follow_megatron_names():
    # Megatron-LM arguments.py: --fp8-recipe choices tensorwise, delayed, mxfp8, blockwise (default delayed);
    # 1 is delayed so a plan saved as fp8 = 1 keeps meaning Megatron's default recipe
    assert FP8_RECIPES == {"none": 0.0, "delayed": 1.0, "tensorwise": 2.0, "mxfp8": 3.0, "blockwise": 4.0}


def test_element_bytes_with_scales():
    # OCP MX v1.0: one E8M0 byte per 32 values; Float8BlockScaling: fp32 per 1x128 tile, per 128x128 weight block
    assert F(memory.fp8_element_bytes(DELAYED)) == 1.0 and F(memory.fp8_element_bytes(TENSORWISE)) == 1.0
    assert F(memory.fp8_element_bytes(MXFP8)) == pytest.approx(1 + 1 / 32)
    assert F(memory.fp8_element_bytes(BLOCKWISE)) == pytest.approx(1 + 4 / 128)
    assert F(memory.fp8_element_bytes(BLOCKWISE, True)) == pytest.approx(1 + 4 / 16384)


def test_weight_copies_by_hand():
    # TE keeps a row-wise and a column-wise (transposed) FP8 copy of each layer weight: 2 (1 + scales) bytes a
    # parameter; with --fp8-param-gather the row-wise copy is the weight itself, so 1 (1 + scales) is added.
    psi = 1e9
    assert F(memory.fp8_weight_copy_bytes(psi, 8.0, 1.0, DELAYED, 0.0, ON)) == pytest.approx(2e9)
    assert F(memory.fp8_weight_copy_bytes(psi, 8.0, 1.0, DELAYED, 1.0, ON)) == pytest.approx(1e9)
    assert F(memory.fp8_weight_copy_bytes(psi, 8.0, 1.0, MXFP8, 0.0, ON)) == pytest.approx(2 * (1 + 1 / 32) * 1e9)
    assert F(memory.fp8_weight_copy_bytes(psi, 8.0, 3.0, DELAYED, 0.0, ON)) == pytest.approx(2e9 / 8)   # ZeRO-3 shard
    assert F(memory.fp8_weight_copy_bytes(psi, 8.0, 1.0, 0.0, 0.0, ON)) == 0.0                          # no FP8
    assert F(memory.fp8_weight_copy_bytes(psi, 8.0, 1.0, DELAYED, 0.0, SEED)) == 0.0                    # seed mode
    # compute weights: 1 + scales bytes with FP8 parameters, else bf16
    assert F(memory.compute_weight_bytes(DELAYED, 1.0)) == 1.0 and F(memory.compute_weight_bytes(DELAYED, 0.0)) == 2.0
    assert F(memory.compute_weight_bytes(0.0, 1.0)) == 2.0


def test_amax_history_by_hand():
    # Llama 3 70B, one stage of all 80 layers: 80 x (QKV, proj, FC1, FC2) = 320 FP8 GEMMs, each 5 TE slots of
    # (history 1024 + scale + inverse scale) fp32: 320 x 5 x 1026 x 4 = 6,566,400 bytes; only delayed keeps one
    m = presets.load_model("llama3-70b")
    assert F(memory.fp8_amax_bytes(m, 80.0, 0.0, 1.0, DELAYED, 1024.0, ON)) == pytest.approx(6_566_400)
    assert F(memory.fp8_amax_bytes(m, 80.0, 0.0, 1.0, TENSORWISE, 1024.0, ON)) == 0.0
    # MoE: 2 attention GEMMs (GQA) + 2 per local expert: Mixtral 8 experts on EP 2 -> 4 local, 32 layers
    mx = presets.load_model("mixtral-8x7b")
    assert F(memory.fp8_amax_bytes(mx, 32.0, 32.0, 2.0, DELAYED, 1.0, ON)) == pytest.approx(32 * (2 + 8) * 5 * 3 * 4)


def test_activations_saved_in_fp8_by_hand():
    # Korthikanti Table 2 GEMM inputs, x s b h: QKV 2 + projection 2 + FC1 2 + FC2 8 = 14, all /t with SP;
    # s = 2048, h = 4096, b = 1, t = 8: sbh = 8,388,608 and FP8 stores them at 1 byte instead of 2
    m = presets.load_model("llama3-8b").replace(seq=2048.0)
    sbh = 2048 * 4096
    assert F(memory.fp8_activation_saving_bytes(m, 8.0, 1.0, 1.0, 1.0, 1.0, DELAYED, ON)) == pytest.approx(sbh * 14 / 8 * 0.5)
    # without SP the QKV and FC1 inputs (4 sbh) are replicated: 4 + 10/t
    assert F(memory.fp8_activation_saving_bytes(m, 8.0, 1.0, 1.0, 1.0, 0.0, DELAYED, ON)) == pytest.approx(sbh * 5.25 * 0.5)
    # MXFP8 stores 1 + 1/32 bytes: saves 1 - 1.03125/2 of the 16-bit bytes
    assert F(memory.fp8_activation_saving_bytes(m, 8.0, 1.0, 1.0, 1.0, 1.0, MXFP8, ON)) == pytest.approx(
        sbh * 14 / 8 * (1 - 1.03125 / 2))
    # full recompute stores only the layer's 16-bit input
    assert F(memory.fp8_activation_saving_bytes(m, 8.0, 1.0, 1.0, 2.0, 1.0, DELAYED, ON)) == 0.0


def test_tp_all_gathers_in_fp8_by_hand():
    # SP: each of the 4 all-reduce equivalents a layer is RS + AG; TE moves the AG half in FP8:
    # (2 + 1) / (2 + 2) = 3/4 of the 16-bit bytes; MXFP8 (2 + 1.03125) / 4; no SP (all-reduce): unchanged
    m = presets.load_model("llama3-8b")
    bf16 = traffic.tp(m, 8.0, 1.0, 1.0, 32.0, 4.0, 1.0, 1.0)["bytes"]
    g = traffic.fp8_gather_bytes(DELAYED, 1.0, ON)
    assert F(traffic.tp(m, 8.0, 1.0, 1.0, 32.0, 4.0, 1.0, 1.0, g)["bytes"] / bf16) == pytest.approx(0.75)
    g = traffic.fp8_gather_bytes(MXFP8, 1.0, ON)
    assert F(traffic.tp(m, 8.0, 1.0, 1.0, 32.0, 4.0, 1.0, 1.0, g)["bytes"] / bf16) == pytest.approx(3.03125 / 4)
    assert F(traffic.tp(m, 8.0, 1.0, 1.0, 32.0, 4.0, 1.0, 0.0, g)["bytes"]) == pytest.approx(
        F(traffic.tp(m, 8.0, 1.0, 1.0, 32.0, 4.0, 1.0, 0.0)["bytes"]))
    assert F(traffic.fp8_gather_bytes(DELAYED, 0.0, ON)) == 2.0 and F(traffic.fp8_gather_bytes(DELAYED, 1.0, SEED)) == 2.0


def test_cast_elements_llama3_70b_by_hand():
    # Llama 3 70B (h 8192, 64 heads of 128, 8 KV heads, FFN 28672 gated), t = 8 with SP, T = 8192 tokens:
    # X a layer: QKV input h/t 1024 + projection input a d/t 1024 + FC1 input h/t 1024 + FC2 input f/t 3584 = 6656
    # dY a layer: QKV output (a d + 2 kv d)/t 1280 + projection output h/t 1024 + FC1 output 2 f/t 7168
    #             + FC2 output h/t 1024 = 10496
    m = presets.load_model("llama3-70b")
    x, dy = compute.fp8_cast_elements(m, 8.0, 1.0, 1.0, 1.0, 80.0, 0.0, ON)
    assert F(x) == pytest.approx(8192 * 80 * 6656) and F(dy) == pytest.approx(8192 * 80 * 10496)


def test_cast_time_by_hand():
    # 1e9 X and 2e9 dY values a microbatch, 4 microbatches, 1e8 weights, 3.35 TB/s (H100 SXM):
    # delayed reads 2 and writes row- and column-wise FP8 (1 + 1) = 4 bytes a value:
    # 4 x 3e9 x 4 + 1e8 x 4 = 4.84e10 bytes; tensorwise reads once more for the amax (6 a value):
    # 4 x 3e9 x 6 + 1e8 x 6 = 7.26e10 bytes
    bw = 3.35e12
    t = lambda r, pg=0.0, rc=1.0: F(compute.fp8_cast_time(1e9, 2e9, 4.0, rc, 1e8, r, pg, bw, ON))  # noqa: E731
    assert t(DELAYED) == pytest.approx(4.84e10 / bw)
    assert t(TENSORWISE) == pytest.approx(7.26e10 / bw)
    # MXFP8 writes 1/32 scale byte per value per copy: 2 + 2 x 1.03125 = 4.0625; weights likewise
    assert t(MXFP8) == pytest.approx((4 * 3e9 * 4.0625 + 1e8 * 4.0625) / bw)
    # FP8 parameters cast from the fp32 master: 4 + 2 bytes a weight
    assert t(DELAYED, pg=1.0) == pytest.approx((4.8e10 + 1e8 * 6) / bw)
    # full recompute casts the forward inputs again
    assert t(DELAYED, rc=2.0) == pytest.approx((4 * 4e9 * 4 + 1e8 * 4) / bw)
    assert t(0.0) == 0.0 and F(compute.fp8_cast_time(1e9, 2e9, 4.0, 1.0, 1e8, DELAYED, 0.0, bw, SEED)) == 0.0


def test_logits_stay_16_bit():
    # Megatron's output layer is tensor_parallel.ColumnParallelLinear, outside TE: 16-bit under FP8.
    # 1e15 GEMM FLOPs of which 1e14 logits, one GPU at 1 PFLOP/s 16-bit and 2 FP8, p = 1:
    # 0.9e15 / 2e15 + 1e14 / 1e15 = 0.55 s (all at the FP8 rate would be 0.5 s)
    c = dse.Cluster.make(gpus=1, domain=1, gpus_per_node=1, bw_up_bytes_per_s=1e11, bw_out_bytes_per_s=1e10,
                         peak_flops_per_s=1e15, hbm_bytes=8e10, peak_fp8_flops_per_s=2e15)
    s, _ = compute.step_compute_time(1e15, 0.0, 1e14, 1.0, 1.0, c, 1.0, 1.0, SEED)
    assert F(s) == pytest.approx(0.55)


MODEL = presets.load_model("llama3-70b")
H100 = presets.load_cluster("h100-sxm").replace(gpus=64.0)
PLAN = dict(tp=8, pp=4, vpp=5, mbs=1, gbs=64, zero=1, recompute=1, sp=1, flash_attention=1)


def _r(cluster=H100, fid="calibrated", **kw):
    return dse.evaluate(MODEL, cluster, dse.Plan.make(**{**PLAN, **kw}), fid)


def test_recipes_on_llama3_70b_h100():
    # the worked example: BF16 vs FP8 delayed vs blockwise, calibrated, 64 H100, TP 8 PP 4 (v 5) DP 2
    bf16, dl, bw = _r(), _r(fp8=DELAYED), _r(fp8=BLOCKWISE)
    assert F(dl.step_s) < F(bf16.step_s) and F(dl.step_s) <= F(bw.step_s)
    # weights: + 2 bytes a layer parameter on the rank (row- and column-wise FP8 copies) + the amax state
    layer_r = F(bf16.params_per_rank) - 128256 * 8192 / 8          # the first stage holds the embedding
    assert F(dl.weights_bytes - bf16.weights_bytes) == pytest.approx(2 * layer_r + 20 * 4 * 5 * 3 * 4, rel=1e-9)
    # activations shrink (GEMM inputs in FP8), so the total moves by copies - saving
    assert F(dl.activations_bytes) < F(bf16.activations_bytes)
    # the SP all-gathers in FP8: TP bytes x 3/4 (Plan.fp8_tp_comm defaults to 1, TE's behaviour)
    assert F(dl.traffic_bytes.tp / bf16.traffic_bytes.tp) == pytest.approx(0.75)
    assert F(_r(fp8=DELAYED, fp8_tp_comm=0).traffic_bytes.tp) == pytest.approx(F(bf16.traffic_bytes.tp))


def test_no_fp8_path_means_16_bit():
    # A100 has no FP8 tensor cores (peak_fp8 = 0): every recipe evaluates as BF16, FP8 parameters too
    a100 = presets.load_cluster("a100-80gb").replace(gpus=64.0)
    base = _r(a100)
    for code in (DELAYED, MXFP8):
        r = _r(a100, fp8=code, fp8_param_gather=1)
        for name in ("step_s", "memory_bytes", "weights_bytes", "activations_bytes"):
            assert F(getattr(r, name)) == F(getattr(base, name)), (code, name)


def test_seed_mode_keeps_only_the_gemm_rate():
    # seed mode (fp8_recipe_terms = 0): FP8 changes the GEMM rate and nothing else
    bf16, fp8 = _r(fid="seed"), _r(fid="seed", fp8=BLOCKWISE)
    for name in ("memory_bytes", "activations_bytes", "weights_bytes"):
        assert F(getattr(fp8, name)) == F(getattr(bf16, name))
    assert F(fp8.traffic_bytes.tp) == F(bf16.traffic_bytes.tp) and F(fp8.compute_s) < F(bf16.compute_s)


def test_recipe_broadcasts_over_a_sweep_axis():
    # the recipe is an array field: one evaluate over [none, delayed, tensorwise, mxfp8, blockwise] equals a loop
    codes = jnp.array([0.0, 1.0, 2.0, 3.0, 4.0])
    fid = calibrated()
    batch = dse.evaluate(MODEL, H100, dse.Plan.make(**PLAN, fp8=codes), fid)
    for i, code in enumerate(codes):
        one = dse.evaluate(MODEL, H100, dse.Plan.make(**PLAN, fp8=float(code)), fid)
        assert F(batch.step_s[i]) == pytest.approx(F(one.step_s), rel=1e-6)
        assert F(batch.memory_bytes[i]) == pytest.approx(F(one.memory_bytes), rel=1e-6)
    # and it traces as an array: the shape of a traced evaluate (jax.eval_shape: traced, not compiled; a
    # jit compiled the whole program, 4.5 CPU-s, for this shape)
    assert jax.eval_shape(lambda p: dse.evaluate(MODEL, H100, p, fid).step_s, dse.Plan.make(**PLAN, fp8=codes)).shape == (5,)


def test_torchao_recasts_instead_of_caching():
    # torchao Float8Linear (plan.fp8_cache = 0) saves the 16-bit input and weight and casts again in backward
    # (torchao/float8/float8_linear.py): no FP8 activations, no cached FP8 weights, and two read passes a
    # tensor, each writing one FP8 copy: delayed 2 x 2 + 2 = 6 bytes a value, weights cast twice a microbatch.
    # 1e9 X + 2e9 dY a microbatch, 4 microbatches, 1e8 weights: 4 x 3e9 x 6 + 4 x 1e8 x 6 = 7.44e10 bytes;
    # tensorwise (dynamic) reads once more before each cast: 2 x 4 + 2 = 10: 4 x 3e9 x 10 + 4 x 1e8 x 10
    bw = 3.35e12
    t = lambda r: F(compute.fp8_cast_time(1e9, 2e9, 4.0, 1.0, 1e8, r, 0.0, bw, ON, 0.0))  # noqa: E731
    assert t(DELAYED) == pytest.approx(7.44e10 / bw)
    assert t(TENSORWISE) == pytest.approx(1.24e11 / bw)
    assert F(memory.fp8_weight_copy_bytes(1e9, 8.0, 1.0, TENSORWISE, 0.0, ON, 0.0)) == 0.0
    m = presets.load_model("llama3-8b")
    assert F(memory.fp8_activation_saving_bytes(m, 8.0, 1.0, 1.0, 1.0, 1.0, TENSORWISE, ON, 0.0)) == 0.0
    # end to end: the torchtitan stack's FP8 keeps BF16's activation memory (torchtitan docs/performance.md
    # Table 3 measures 62.0 GiB BF16 and 61.8 GiB Float8)
    kw = dict(tp=1, pp=1, mbs=2, gbs=256, zero=3, recompute=1, sp=0, flash_attention=1, grad_accum=1)
    c = presets.load_cluster("h100-sxm").replace(gpus=128.0)
    bf16 = dse.evaluate(m, c, dse.Plan.make(**kw), "calibrated")
    fp8 = dse.evaluate(m, c, dse.Plan.make(**kw, fp8=TENSORWISE, fp8_cache=0), "calibrated")
    assert F(fp8.activations_bytes) == F(bf16.activations_bytes) and F(fp8.weights_bytes) == F(bf16.weights_bytes)


# ---------------------------------------------------------------- the hardware a recipe needs

def test_fp8_recipe_needs_its_tensor_core_scaling():
    # Transformer Engine's support matrix: no FP8 on Ampere (8.0); per-tensor and block scaling on
    # Hopper (9.0) but no MXFP8; MXFP8 on Blackwell data center (10.0). A plan whose recipe its
    # hardware lacks is infeasible (fp8_unsupported), and a single plan is refused with one line.
    from dse import reason_names
    from dse.equations import feasibility

    m = presets.load_model("llama3-70b")
    plan = dse.Plan.make(tp=8, pp=4, mbs=1, gbs=512)
    cases = [("h100-sxm", "mxfp8", True), ("h100-sxm", "blockwise", False), ("h100-sxm", "delayed", False),
             ("b200", "mxfp8", False), ("a100-80gb", "delayed", True), ("a100-80gb", "none", False),
             ("mi300x", "tensorwise", False), ("mi300x", "blockwise", True)]
    for name, recipe, refused in cases:
        c = presets.load_cluster(name)
        r = dse.evaluate(m, c, plan.replace(fp8=FP8_RECIPES[recipe]), "calibrated")
        assert ("fp8_unsupported" in reason_names(r.reasons)) == refused, (name, recipe)
    h100 = presets.load_cluster("h100-sxm")
    d, _, mb = dse.derived(h100, plan)
    q = feasibility.quantities(m, h100, plan.replace(fp8=FP8_RECIPES["mxfp8"]), d, mb, 0.0, False)
    field, msg = feasibility.structural_error(q)
    assert field == "fp8" and "allowed: none, delayed, tensorwise, blockwise" in msg


def test_fp8_scaling_preset_values_are_checked():
    from dse.errors import InputError

    base = dict(gpus=8, tflops=989, hbm_GB=80, domain=8, bw_up_GBps=450, bw_out_GBps=50)
    assert float(presets.cluster_from_fields({**base, "fp8_scaling": "blockwise"}).fp8_scaling) == 2.0
    with pytest.raises(InputError, match="fp8_scaling: unknown 'mx'; allowed: none, per-tensor, blockwise, mxfp8"):
        presets.cluster_from_fields({**base, "fp8_scaling": "mx"})
    with pytest.raises(InputError, match="fp8_scaling"):
        presets.cluster_from_fields({**base, "fp8_scaling": 5})
