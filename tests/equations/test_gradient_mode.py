"""ZeRO-2 semantics: sharded gradients are reduce-scattered every microbatch (issue 17, defect 3)."""

import jax.numpy as jnp
import pytest

import dse
from dse.equations import memory
from dse.inputs import presets

MODEL = presets.load_model("llama3-8b")
CLUSTER = presets.load_cluster("h100-sxm").replace(gpus=64.0)
PLAN = dict(tp=8, pp=1, mbs=1, gbs=64, recompute=1)   # d = 8, m = 8 microbatches


def _r(zero, **kw):
    return dse.evaluate(MODEL, CLUSTER, dse.Plan.make(zero=zero, **{**PLAN, **kw}), "calibrated")


def test_zero2_is_not_zero1_with_local_accumulation():
    # Before the fix ZeRO-2 with grad_accum = 0 reported exactly ZeRO-1's memory and traffic
    # (grads 2 Psi_r unsharded, one reduce-scatter a step), so sweeps listed both as plans.
    # ZeRO sec.5.2 / DeepSpeed stage 2: the backward reduces each bucket into its owner's
    # partition every microbatch, so the gradients are 2 Psi_r / d and m reduce-scatters go out.
    z1, z2 = _r(1), _r(2)
    psi_r = float(z1.params_per_rank)
    assert float(z1.grads_bytes) == pytest.approx(2 * psi_r, rel=1e-12)
    assert float(z2.grads_bytes) == pytest.approx(2 * psi_r / 8, rel=1e-12)
    # ZeRO sec.7: RS + AG of 2 Psi_r bytes x 7/8 a step; ZeRO-2 sends m = 8 reduce-scatters.
    assert float(z1.traffic_bytes.dp) == pytest.approx(2 * 2 * psi_r * 7 / 8, rel=1e-12)
    assert float(z2.traffic_bytes.dp) == pytest.approx((1 + 8) * 2 * psi_r * 7 / 8, rel=1e-12)
    assert not z1.to_json()["grads_sharded"] and not z1.to_json()["grad_reduce_per_microbatch"]
    assert z2.to_json()["grads_sharded"] and z2.to_json()["grad_reduce_per_microbatch"]


def test_zero1_with_per_microbatch_reduce_says_so():
    r = _r(1, grad_accum=1).to_json()
    assert r["grad_reduce_per_microbatch"] and not r["grads_sharded"]


def test_seed_mode_keeps_the_seed_zero2():
    # Seed 000 sec.1: ZeRO-2 is (2 + 14/d) Psi_r and reduces once a step.
    g, ga = memory.gradient_mode(jnp.float64(2.0), 0.0, 8.0, 0.0)
    assert float(g) == 2.0 and float(ga) == 0.0


def test_fp8_param_gather_halves_the_weight_all_gather():
    # Megatron-LM --fp8-param-gather: the layer weights kept in FP8 (1 byte) and all-gathered in
    # FP8; the embedding and output layer (outside Transformer Engine) stay 16-bit, gradients
    # reduce-scatter in 16 bits. ZeRO-1, d = 8, one RS + one AG a step:
    # bytes = (2 Psi_r + 1 L_r + 2 E_r) 7/8 instead of 4 Psi_r 7/8, with E_r = 2 V h / t the
    # embedding and output layer (Llama 3 8B: V = 128256, h = 4096, untied) and L_r = Psi_r - E_r.
    base = _r(1, fp8=1)
    r = _r(1, fp8=1, fp8_param_gather=1)
    psi_r = float(r.params_per_rank)
    e_r = 2 * 128256 * 4096 / 8
    l_r = psi_r - e_r
    assert float(base.traffic_bytes.dp) == pytest.approx(4 * psi_r * 7 / 8, rel=1e-12)
    assert float(r.traffic_bytes.dp) == pytest.approx((2 * psi_r + l_r + 2 * e_r) * 7 / 8, rel=1e-12)
    # weights: FP8 layer weights (1 L_r) + their FP8 transpose (1 L_r) + 16-bit embeddings (2 E_r) +
    # delayed scaling's state (32 layers x 4 GEMMs x 5 tensors x (history 1 + 2) x 4 bytes)
    amax = 32 * 4 * 5 * 3 * 4
    assert float(r.weights_bytes) == pytest.approx(2 * l_r + 2 * e_r + amax, rel=1e-12)
    # without param gather: 16-bit weights plus row-wise and column-wise FP8 copies of the layers
    assert float(base.weights_bytes) == pytest.approx(2 * psi_r + 2 * l_r + amax, rel=1e-12)
    assert float(_r(1, fp8_param_gather=1).weights_bytes) == pytest.approx(2 * psi_r, rel=1e-12)  # needs fp8


def test_fp32_gradient_buffers_double_the_gradients_and_their_reduce():
    # Plan.grad_bytes 4 (Megatron-LM under --bf16: fp32 gradient accumulation and reduction,
    # arguments.py): the unsharded ZeRO-1 gradients take 4 Psi_r bytes, and the step's reduce-scatter
    # moves 4 Psi_r x 7/8 beside the 2 Psi_r x 7/8 of the 16-bit parameter all-gather (ZeRO sec.7).
    z1, z4 = _r(1), _r(1, grad_bytes=4)
    psi_r = float(z1.params_per_rank)
    assert float(z4.grads_bytes) == pytest.approx(4 * psi_r, rel=1e-12)
    assert float(z4.traffic_bytes.dp) == pytest.approx((4 + 2) * psi_r * 7 / 8, rel=1e-12)
    assert float(z4.memory_bytes) - float(z1.memory_bytes) == pytest.approx(2 * psi_r, rel=1e-9)
    # ZeRO-2 shards them: 4 Psi_r / d
    assert float(_r(2, grad_bytes=4).grads_bytes) == pytest.approx(4 * psi_r / 8, rel=1e-12)
    # Kept fp32, reduced 16-bit (Plan.grad_reduce_bytes 2: XLA reduces the gradient dot's bf16 output,
    # benchmarks/xla_fsdp_dtypes.py): the buffer's 4 Psi_r bytes, the reduce-scatter's 2 Psi_r x 7/8
    x = _r(1, grad_bytes=4, grad_reduce_bytes=2)
    assert float(x.grads_bytes) == pytest.approx(4 * psi_r, rel=1e-12)
    assert float(x.traffic_bytes.dp) == pytest.approx((2 + 2) * psi_r * 7 / 8, rel=1e-12)
    assert float(_r(1, grad_bytes=4, grad_reduce_bytes=4).traffic_bytes.dp) == float(z4.traffic_bytes.dp)
