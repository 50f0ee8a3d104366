"""Context parallelism as it costs (issue 17 item 8): attention calls at s/c, the backward
K/V re-gather, ring attention's per-step overlap, CP's working buffers. Numbers by hand."""

import pytest

from dse import Plan, evaluate
from dse.equations import compute, memory, schedule, traffic
from dse.inputs import presets
from dse.inputs.fidelity import Fidelity, resolve

CAL = resolve("calibrated")
SEED = resolve("seed")
L405 = presets.load_model("llama3-405b")   # 126 layers, h 16384, 128 heads of 128, 8 KV heads, s 8192


def test_attention_call_flops_by_hand():
    # One layer's forward core on one TP rank: 2 s^2 (a/t)(d_qk + d_v) = 2 x 8192^2 x 16 x 256
    # = 5.4976e11 FLOPs (attention_flops' 6 L b s^2 a (d_qk + d_v) over 3 L t). CP 4 with 2c = 8
    # chunks gives a rank the same 1/4 of it: all-gather, one call of 1.3744e11; ring, 4 steps
    # of 3.4360e10.
    whole = 2 * 8192 ** 2 * 16 * 256
    assert float(compute.attention_call_flops(L405, 8.0, 1.0, 1.0, 0.0, CAL)) == pytest.approx(whole, rel=1e-12)
    assert float(compute.attention_call_flops(L405, 8.0, 4.0, 1.0, 0.0, CAL)) == pytest.approx(whole / 4, rel=1e-12)
    assert float(compute.attention_call_flops(L405, 8.0, 4.0, 1.0, 1.0, CAL)) == pytest.approx(whole / 16, rel=1e-12)


def test_attention_call_slowdown_is_the_fixed_time_a_call():
    # t0 = 5 us at 300 TFLOP/s is 1.5e9 FLOPs of time a call: ring CP 4 of the call above runs
    # (1 + 1.5e9 / 3.436e10) / (1 + 1.5e9 / 5.4976e11) = 1.04365 / 1.00273 = 1.04081 x slower.
    fid = Fidelity.make(gemm_shape=1.0, gemm_overhead_s=5e-6)
    whole = 2 * 8192 ** 2 * 16 * 256
    got = float(compute.attention_call_slowdown(whole / 16, whole, 300e12, fid))
    assert got == pytest.approx((1 + 1.5e9 / (whole / 16)) / (1 + 1.5e9 / whole), rel=1e-12)
    assert got == pytest.approx(1.04081, abs=1e-5)
    assert float(compute.attention_call_slowdown(whole, whole, 300e12, fid)) == 1.0   # no CP: the fitted rate
    assert float(compute.attention_call_slowdown(whole / 16, whole, 300e12, SEED)) == 1.0   # seed: off


def test_cp_traffic_counts_the_backward_regather():
    # K + V of Llama 3 405B: 2 x 8 x 128 = 2048 values a token, / t = 8, b = 1, s = 8192, bf16:
    # G = 8192 x 256 x 2 = 4,194,304 bytes. A rank sends G (c-1)/c = 3G/4 a collective at c = 4.
    G = 8192 * 2048 / 8 * 2
    # Seed (seed 000 sec.4): x1.5 forward AG under full recompute + one RS: 2.5 collectives a block.
    seed = traffic.cp(L405, 8.0, 4.0, 1.0, 1.0, 1.0, 2.0)
    assert float(seed["bytes"]) == pytest.approx(2.5 * 0.75 * G)
    # Real: selective recompute re-runs the core (1 + 1 forwards), backward AG + RS: 4 collectives.
    ag = traffic.cp(L405, 8.0, 4.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0)
    assert float(ag["bytes"]) == pytest.approx(4 * 0.75 * G)
    assert float(ag["steps"]) == 4 * 3
    # Ring: the same 12 hops of G/4 and the dK/dV hop home: 13 G / 4.
    ring = traffic.cp(L405, 8.0, 4.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
    assert float(ring["bytes"]) == pytest.approx(13 * G / 4)
    assert float(ring["steps"]) == 13
    assert float(traffic.cp(L405, 8.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)["bytes"]) == 0.0


def test_ring_attention_exposed_step_by_step():
    # c = 4, one forward, backward K/V + dK/dV (2 units), one hop home, one block; forward core
    # 4 s, so a step is a = 1 s; 10 hops on 15 s of wire: x = 1.5 s. Forward 3 x (1.5 - 1) = 1.5,
    # backward 3 x 2 x (1.5 - 2/2) = 3, home 1.5: 6 s exposed of 15.
    got = schedule.ring_attention_exposed(15.0, 10.0, 1.0, 2.0, 1.0, 4.0, 4.0, 1.0)
    assert float(got) == pytest.approx(6.0)
    # Transfers shorter than a step hide; only the hop home stays (x = 0.5 s).
    assert float(schedule.ring_attention_exposed(5.0, 10.0, 1.0, 2.0, 1.0, 4.0, 4.0, 1.0)) == pytest.approx(0.5)
    assert float(schedule.ring_attention_exposed(5.0, 10.0, 1.0, 2.0, 1.0, 1.0, 4.0, 1.0)) == 0.0   # no CP


def test_cp_buffer_bytes_by_hand():
    # G = 4,194,304 bytes (above). All-gather: K/V gathered + dK/dV full-length = 2G = 8.39 MB;
    # ring at c = 4: max(G, 4G/4) = G; at c = 2: 4G/2 = 2G; none without CP or in seed mode.
    G = 8192 * 2048 / 8 * 2
    assert float(memory.cp_buffer_bytes(L405, 8.0, 4.0, 1.0, 0.0, CAL)) == pytest.approx(2 * G)
    assert float(memory.cp_buffer_bytes(L405, 8.0, 4.0, 1.0, 1.0, CAL)) == pytest.approx(G)
    assert float(memory.cp_buffer_bytes(L405, 8.0, 2.0, 1.0, 1.0, CAL)) == pytest.approx(2 * G)
    assert float(memory.cp_buffer_bytes(L405, 8.0, 1.0, 1.0, 0.0, CAL)) == 0.0
    assert float(memory.cp_buffer_bytes(L405, 8.0, 4.0, 1.0, 0.0, SEED)) == 0.0


def test_ring_hides_more_than_the_all_gather_and_cp1_pays_nothing():
    # Llama 3 405B on 16,384 H100, TP 8 CP 4 PP 4 (calibrated): the K/V all-gather is exposed
    # whole (TE: "KV all-gather between CP ranks is exposed"), the ring hides all but its hops
    # home and the per-step excess, and CP 1 has no CP time at all.
    cl = presets.load_cluster("h100-sxm").replace(gpus=16384.0)
    base = dict(tp=8, pp=4, cp=4, mbs=1, gbs=2048, zero=1, recompute=1, sp=1)
    ag = evaluate(L405, cl, Plan.make(**base), CAL)
    ring = evaluate(L405, cl, Plan.make(**base, cp_ring=1), CAL)
    assert float(ag.exposed_s.cp) == pytest.approx(float(ag.wire_s.cp))
    assert 0 < float(ring.exposed_s.cp) < 0.2 * float(ring.wire_s.cp)
    one = evaluate(L405, cl, Plan.make(**dict(base, cp=1, pp=16)), CAL)
    assert float(one.exposed_s.cp) == 0.0 and float(one.traffic_bytes.cp) == 0.0


def test_gradients_reduce_and_zero_shards_over_dp_times_cp():
    # CP ranks hold the same weights (they split tokens): Megatron-Core reduces gradients and
    # shards the distributed optimizer over DP x CP. TP 8 CP 4 PP 4 on 16,384: d = 128, so
    # ZeRO-1's 12 bytes a parameter shard over 512 ranks: 12 x 12.81B / 512 = 300 MB (seed: / 128).
    from dse.equations.degrees import weight_replicas
    assert weight_replicas(128.0, 16.0, 4.0) == (512.0, 64.0)
    assert weight_replicas(128.0, 16.0, 4.0, 0.0) == (128.0, 16.0)
    cl = presets.load_cluster("h100-sxm").replace(gpus=16384.0)
    r = evaluate(L405, cl, Plan.make(tp=8, pp=4, cp=4, mbs=1, gbs=2048, zero=1, recompute=1, sp=1), CAL)
    assert float(r.optimizer_bytes) == pytest.approx(12.0 * float(r.params_per_rank) / 512, rel=1e-12)
    # DP traffic: reduce-scatter + all-gather of the 2-byte buffer over 512, 2 x 2 Psi_r 511/512.
    assert float(r.traffic_bytes.dp) == pytest.approx(2 * 2.0 * float(r.params_per_rank) * 511 / 512, rel=1e-12)


def test_ring_exposure_relaxes_at_step_scale():
    # Co-design relaxes cp: the per-hop max(0, x - a) is taken over a step's seconds, so the
    # smooth step stays within 0.5% of the exact one at sharpness 20 (18 ms of 7.7 s once fused
    # attention shortened each block's compute; ln2/k a hop x thousands of hops would be seconds),
    # and its gradient matches a central difference (x64).
    import jax
    cl = presets.load_cluster("h100-sxm").replace(gpus=16384.0)
    pl = Plan.make(tp=8.0, pp=4.0, cp=4.0, mbs=1.0, gbs=2048.0, zero=1.0, recompute=1.0, cp_ring=1.0)
    f = lambda c: evaluate(L405, cl, pl.replace(cp=c), CAL, sharpness=20.0).step_s   # noqa: E731
    exact = float(evaluate(L405, cl, pl, CAL).step_s)
    assert abs(float(f(4.0)) - exact) < 0.005 * exact
    # one compiled gradient (dse/engines/compiled.py COMPILE_FIRST, as co-design compiles it), not
    # eager jax.grad op by op (50-110 small compiles, 3-5 CPU-s)
    from dse.engines.compiled import COMPILE_FIRST, compile_lowered
    g = float(compile_lowered(jax.jit(jax.grad(f)).lower(4.0), COMPILE_FIRST)(4.0))
    assert g == pytest.approx(float((f(4.0 + 1e-4) - f(4.0 - 1e-4)) / 2e-4), rel=1e-5)
