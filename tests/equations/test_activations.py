"""Activations tensor by tensor (memory.layer_tensor_bytes) and the recompute table (memory.RECOMPUTE_MODES)."""

import pytest

import dse
from dse.equations import compute, memory
from dse.errors import InputError
from dse.inputs import checks, presets
from dse.inputs.fidelity import resolve

REAL = resolve("calibrated")     # real_shapes = 1: the model's own structure


def _gpt3(**kw):
    # GPT-3 175B (Brown et al. 2020 Table 2.1): LayerNorm, GeLU FFN of 4h, 96 heads of 128, dropout on
    return presets.load_model("gpt3-175b").replace(**kw)


@pytest.mark.parametrize("t,sp", [(1.0, 0.0), (8.0, 0.0), (8.0, 1.0)])
def test_gpt3_with_dropout_is_korthikanti(t, sp):
    # Korthikanti et al. 2022 sec.4.1, counted by hand for one layer, bytes a token (x s b):
    #   attention 11h + 5as: QKV input 2h, Q and K 4h, softmax output 2as, its dropout mask as and
    #     output 2as, V 2h, projection input 2h, dropout mask h;
    #   MLP 19h: FC1 input 2h, GeLU input 8h, FC2 input 8h, dropout mask h; two LayerNorm inputs 4h.
    # Total 34 s b h + 5 a s^2 b (eq.(1)); Table 2: without SP 10 + 24/t (+ 5as/(ht)), with SP 34/t.
    m = _gpt3()
    s, h, a = 2048.0, 12288.0, 96.0
    rep, split = 4 * h + 2 * h + h + 2 * h + h, 4 * h + 2 * h + 2 * h + 8 * h + 8 * h
    assert rep + split == 34 * h and (rep, split) == (10 * h, 24 * h)
    scores = 5 * a * s
    want = (rep / (t if sp else 1.0) + split / t + scores / t) * s
    got = memory.activation_bytes_per_layer(m, t, 1.0, 1.0, 0.0, sp, REAL, 0.0)
    assert float(got) == pytest.approx(want, rel=1e-12)
    # selective (Korthikanti sec.5): the 5as^2b scores go, eq.(6)
    sel = memory.activation_bytes_per_layer(m, t, 1.0, 1.0, 1.0, sp, REAL, 0.0)
    assert float(sel) == pytest.approx(want - scores / t * s, rel=1e-12)


def test_llama_layer_by_hand():
    # Llama 3 8B (config.json: h 4096, 32 heads, 8 KV heads of 128, SwiGLU of 14336, no dropout),
    # SDPA flash attention, no recompute, t = 1, a token: norm inputs 4h, QKV input 2h, Q 2h,
    # K and V 2 x 2 x 1024, logsumexp 4 x 32, attention output 2h, FC1 input 2h, gate and up
    # 2 x 2 x 14336, down input 2 x 14336: no dropout masks, no s^2 scores.
    m = presets.load_model("llama3-8b")
    h, f = 4096, 14336
    per_token = 4 * h + 2 * h + 2 * h + 4 * 1024 + 4 * 32 + 2 * h + 2 * h + 6 * f
    got = memory.activation_bytes_per_layer(m, 1.0, 1.0, 1.0, 0.0, 0.0, REAL, 1.0)
    assert float(got) == pytest.approx(8192 * per_token, rel=1e-12)
    assert per_token / h == pytest.approx(34.03, abs=0.01)      # Korthikanti's 34 for GPT-3 holds other tensors


def test_torchtitan_op_policy_by_hand():
    # torchtitan's op-level selective AC (torchtitan/parallelisms/parallelize_llama.py at 004b314):
    # saves every mm output but every second (wq, wv, w1, w2 of wq wk wv wo w1 w3 w2), the SDPA output
    # and logsumexp, and the block input. Llama 3 8B, a token: input 2h + wq 2h + wv 2 x 1024 +
    # SDPA 2h + 4 x 32 + w1 2 x 14336 + w2 2h = 15.53 h, the "about 15.5 sbh" of the xfail it replaces.
    m = presets.load_model("llama3-8b")
    h = 4096
    per_token = 2 * h + 2 * h + 2 * 1024 + 2 * h + 4 * 32 + 2 * 14336 + 2 * h
    got = memory.activation_bytes_per_layer(m, 1.0, 1.0, 1.0, 3.0, 0.0, REAL, 1.0)
    assert float(got) == pytest.approx(8192 * per_token, rel=1e-12)
    assert per_token / h == pytest.approx(15.53, abs=0.01)
    # a plain (GeLU) FFN has six mm: wq wk wv wo w1 w2, so w2's output (6th) is not saved
    plain = m.replace(ffn_gated=0.0)
    got = memory.activation_bytes_per_layer(plain, 1.0, 1.0, 1.0, 3.0, 0.0, REAL, 1.0)
    assert float(got) == pytest.approx(8192 * (per_token - 2 * h), rel=1e-12)


def test_maxtext_save_qkv_proj_by_hand():
    # MaxText's remat_policy save_qkv_proj (save_only_these_names("query_proj", "value_proj", "key_proj",
    # "qkv_proj")): a scanned layer keeps its input and the Q, K, V projections' outputs. Llama 3 70B
    # (h 8192, 64 heads and 8 KV heads of 128, SwiGLU of 28672), t = 1, a token: input 2h + Q 2h + K and
    # V 2 x 2 x 1024 = 4.5 h bytes. The backward reruns the rest of the forward: every GEMM but wq, wk, wv,
    # (8192^2 + 2 x 8192 x 1024) / (2 x 8192^2 + 2 x 8192 x 1024 + 3 x 8192 x 28672) = 9.80% of the
    # layer's weights, so 90.20% of its forward GEMMs and the attention core once more.
    m = presets.load_model("llama3-70b")
    h, kv, f = 8192, 1024, 28672
    got = memory.activation_bytes_per_layer(m, 1.0, 1.0, 1.0, dse.RECOMPUTE["qkv"], 0.0, REAL, 1.0)
    assert float(got) == pytest.approx(8192 * (2 * h + 2 * h + 4 * kv), rel=1e-12)
    assert float(got) / (8192 * h) == pytest.approx(4.5, rel=1e-12)
    layer = 2 * h * h + 2 * h * kv + 3 * h * f
    gemm, attn = compute.recompute_flops(3.0, 2.0, dse.RECOMPUTE["qkv"], REAL, m)
    assert float(gemm) == pytest.approx(1.0 - (h * h + 2 * h * kv) / layer, rel=1e-9)
    assert float(gemm) == pytest.approx(0.9020, abs=1e-4)
    assert float(attn) == pytest.approx(2.0 * compute.FWD_SHARE, rel=1e-12)
    # it reruns the layer as full recompute does (TP collectives, elementwise passes, FP8 casts)
    assert float(memory.is_full_recompute(dse.RECOMPUTE["qkv"])) == 1.0
    # between full and none in memory and in hardware FLOPs, through evaluate
    c = presets.load_cluster("h100-sxm").replace(gpus=64.0)
    runs = [dse.evaluate(m.replace(seq=8192), c, dse.Plan.make(tp=1, pp=1, mbs=1, gbs=64, zero=3, recompute=dse.RECOMPUTE[rc],
                                                               flash_attention=1), "calibrated")
            for rc in ("full", "qkv", "none")]
    acts = [float(r.activations_bytes) for r in runs]
    hw = [float(r.hardware_flops) for r in runs]
    assert acts[0] < acts[1] < acts[2] and hw[0] > hw[1] > hw[2]


def test_full_recompute_keeps_one_input_a_group():
    # Korthikanti sec.5: full recompute keeps the layer input, 2 s b h (/t with SP); a checkpoint of
    # 4 layers (Megatron --recompute-num-layers 4, uniform) keeps one input for the 4.
    m = _gpt3()
    one = memory.activation_bytes_per_layer(m, 8.0, 1.0, 1.0, 2.0, 1.0, REAL, 1.0)
    assert float(one) == pytest.approx(2 * 2048 * 12288 / 8, rel=1e-12)
    four = memory.activation_bytes_per_layer(m, 8.0, 1.0, 1.0, 2.0, 1.0, REAL, 1.0, 4.0)
    assert float(four) == pytest.approx(float(one) / 4, rel=1e-12)


def test_recompute_flops_follow_the_table():
    # What a mode recomputes is what it does not keep: full runs every GEMM again (x 1/3 of the
    # layer's 6 Psi B s: FWD_SHARE), op runs wk, wo and w3 again, selective and op run no GEMM.
    m = presets.load_model("llama3-8b")
    f_layer = 3.0e18
    share = {}
    for name, code in dse.RECOMPUTE.items():
        gemm, _ = compute.recompute_flops(f_layer, 1.0, code, REAL, m)
        share[name] = float(gemm) / (compute.FWD_SHARE * f_layer)
    h, kv, f = 4096, 1024, 14336
    layer = 2 * h * h + 2 * h * kv + 3 * h * f                        # wq wo, wk wv, w1 w3 w2
    assert share == pytest.approx({"none": 0.0, "selective": 0.0, "full": 1.0,
                                   "op": (h * kv + h * h + h * f) / layer,
                                   "qkv": 1.0 - (h * h + 2 * h * kv) / layer})   # all but wq, wk, wv
    cores = {n: float(memory.attention_core_recomputes(c, REAL)) for n, c in dse.RECOMPUTE.items()}
    assert cores == {"none": 0.0, "selective": float(REAL.selective_attn_recompute), "full": 1.0, "op": 0.0,
                     "qkv": 1.0}
    # every tensor a mode keeps is one the layer has, and every mode in plan.RECOMPUTE has a row
    assert set(memory.RECOMPUTE_MODES) == set(dse.RECOMPUTE)
    for row in memory.RECOMPUTE_MODES.values():
        assert set(row["keeps"]) <= set(memory.LAYER_TENSORS)


def test_op_mode_through_evaluate_and_bad_values():
    m = presets.load_model("llama3-8b")
    c = presets.load_cluster("h100-sxm").replace(gpus=8.0)
    runs = {rc: dse.evaluate(m, c, dse.Plan.make(tp=1, pp=1, mbs=1, gbs=8, zero=3, recompute=dse.RECOMPUTE[rc],
                                                  flash_attention=1), "calibrated") for rc in ("selective", "op", "full")}
    acts = [float(runs[k].activations_bytes) for k in ("selective", "op", "full")]
    assert acts[0] > acts[1] > acts[2]
    hw = [float(runs[k].hardware_flops) for k in ("selective", "op", "full")]
    assert hw[0] < hw[1] < hw[2]
    assert checks.plan_value("--recompute", "op") == 3.0
    with pytest.raises(InputError, match="recompute: 'layer' is not allowed; allowed: none, selective, full, op, qkv"):
        checks.plan_value("--recompute", "layer")
    with pytest.raises(InputError, match="recompute_layers"):
        checks.plan_value("plan.recompute_layers", 0.5)
    with pytest.raises(InputError, match="dropout"):
        presets.model_from_fields({"layers": 2, "hidden": 64, "heads": 4, "seq": 128, "dropout": 2})


def test_layer_level_recompute_mixes_full_and_none():
    # torchtitan selective_ac_option N / Plan.recompute_every: full recompute of floor(L/N) layers of a
    # stage, the others keep every tensor. Llama 3 8B, flash attention, t = 1, b = 1, s = 8192, one
    # 32-layer stage (p = 1, m = 1), from the per-mode layers above:
    #   full layer: its input, 2h = 8192 B a token -> 8192 x 8192 = 67,108,864 B
    #   none layer: 139,392 B a token (test_llama_layer_by_hand) -> 8192 x 139,392 = 1,141,899,264 B
    #   N = 2: 16 x full + 16 x none = 16 x 1,209,008,128 = 19,344,130,048 B
    #   N = 3: floor(32/3) = 10 full + 22 none = 671,088,640 + 25,121,783,808 = 25,792,872,448 B
    m = presets.load_model("llama3-8b")
    full = memory.activation_bytes_per_layer(m, 1.0, 1.0, 1.0, 2.0, 0.0, REAL, 1.0)
    none = memory.activation_bytes_per_layer(m, 1.0, 1.0, 1.0, 0.0, 0.0, REAL, 1.0)
    assert (float(full), float(none)) == (67_108_864.0, 1_141_899_264.0)

    def stage(rc, every):
        return float(memory.activation_bytes(m, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, rc, 0.0, fid=REAL, flash=1.0,
                                             every=every))
    assert stage(2.0, 2.0) == pytest.approx(19_344_130_048.0, rel=1e-12)
    assert stage(2.0, 3.0) == pytest.approx(25_792_872_448.0, rel=1e-12)
    assert stage(2.0, 1.0) == 32 * float(full)                  # N = 1: today's full recompute, exactly
    assert stage(2.0, 64.0) == pytest.approx(32 * float(none), rel=1e-12)   # N > L: no layer recomputed
    assert stage(1.0, 2.0) == stage(1.0, 1.0)                   # N acts on full recompute only
    # the share compute reads: floor(L/N) / L
    share = [float(memory.full_recompute_share(L, n)) for L, n in ((32.0, 1.0), (32.0, 2.0), (32.0, 3.0),
                                                                     (40.0, 2.0), (32.0, 64.0))]
    assert share == pytest.approx([1.0, 0.5, 10 / 32, 0.5, 0.0])


def test_layer_level_recompute_flops_and_evaluate():
    # Recompute FLOPs of the recomputed share only: N = 2 on an even stage is half of full's extra
    # forward, GEMMs and attention core alike (compute.recompute_flops).
    m = presets.load_model("llama3-8b")
    g_full, a_full = compute.recompute_flops(3.0e18, 1.0e18, 2.0, REAL, m)
    g_half, a_half = compute.recompute_flops(3.0e18, 1.0e18, 2.0, REAL, m, 0.5)
    assert (float(g_half), float(a_half)) == (float(g_full) / 2, float(a_full) / 2)
    # through dse.evaluate: Llama 3 8B on 8 H100s, p = 1 (32 layers a stage): hardware - model FLOPs
    # halves; every other layer keeps its tensors, so the activations sit between full and none.
    c = presets.load_cluster("h100-sxm").replace(gpus=8.0)

    def run(rc, every=1.0):
        return dse.evaluate(m, c, dse.Plan.make(tp=1, pp=1, mbs=1, gbs=8, zero=3, recompute=rc,
                                                recompute_every=every, flash_attention=1), "calibrated")
    full, half, none = run(2.0), run(2.0, 2.0), run(0.0)
    extra = lambda r: float(r.hardware_flops) - float(r.model_flops)   # noqa: E731
    assert extra(half) == pytest.approx(extra(full) / 2, rel=1e-12)
    assert float(full.activations_bytes) < float(half.activations_bytes) < float(none.activations_bytes)
    assert float(none.step_s) < float(half.step_s) < float(full.step_s)
    sel = run(1.0, 2.0)
    assert float(sel.step_s) == float(run(1.0).step_s)             # N acts on full recompute only
    with pytest.raises(InputError, match="recompute_every: 0 is not allowed; allowed: integers >= 1"):
        checks.plan_value("plan.recompute_every", 0)
