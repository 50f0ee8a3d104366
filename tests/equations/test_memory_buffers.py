"""The buffers beside the model states (dse/equations/memory.py), each pinned to its source by hand."""

import jax.numpy as jnp
import pytest

import dse
from dse.equations import memory
from dse.inputs import fidelity, presets

MiB = 2 ** 20
GiB = 2 ** 30


def _cal():
    return fidelity.calibrated()


def test_logits_fp32_and_temporaries_vocab_parallel():
    # GPT-3 175B (V = 51200, s = 2048), b = 1, t = 8: s b V / t = 13.1M logits a rank, kept in fp32
    # for the softmax backward (Korthikanti sec.4.3: 4 s b v / t) plus the 16-bit GEMM output:
    # 6 bytes each = 78.64 MB.
    m = presets.load_model("gpt3-175b")
    got = float(memory.logits_bytes(m, 8.0, 1.0, 1.0, _cal()))
    assert got == pytest.approx(6 * 2048 * 51200 / 8, rel=1e-12)
    # CP splits the tokens: c = 2 halves it; seed mode keeps none.
    assert float(memory.logits_bytes(m, 8.0, 2.0, 1.0, _cal())) == pytest.approx(got / 2, rel=1e-12)
    assert float(memory.logits_bytes(m, 8.0, 1.0, 1.0, dse.Fidelity.seed())) == 0.0


def test_p1_output_layer_keeps_korthikanti_f09():
    # Korthikanti sec.4.3 (validation F09): with p = 1 the output layer stores 4 s b h / t (1 + v/h);
    # dse splits it into the layer-norm/output input (activations) and the fp32 logits (logits part).
    m, fid = presets.load_model("gpt3-175b"), _cal()
    s, b, h, v, t = 2048, 1, 12288, 51200, 8
    stored = float(memory.output_layer_input_bytes(m, t, 1.0, b, fid)) + 4 * s * b * v / t
    assert stored == pytest.approx(4 * s * b * h / t * (1 + v / h), rel=1e-12)


def test_sp_gather_buffer():
    # SP all-gathers the s/c x b x h 16-bit input of a column-parallel GEMM: GPT-3, b = 1:
    # 2 x 2048 x 12288 = 50.33 MB; without SP (in-place all-reduce) or without TP: none.
    m, fid = presets.load_model("gpt3-175b"), _cal()
    assert float(memory.sp_gather_bytes(m, 8.0, 1.0, 1.0, 1.0, fid)) == pytest.approx(2 * 2048 * 12288)
    assert float(memory.sp_gather_bytes(m, 8.0, 1.0, 1.0, 0.0, fid)) == 0.0
    assert float(memory.sp_gather_bytes(m, 1.0, 1.0, 1.0, 1.0, fid)) == 0.0


def test_zero3_units_and_dp_buckets():
    # ZeRO-3: two gathered 16-bit units (in use + prefetched) and one unsharded 16-bit gradient:
    # 6 bytes a parameter of the unit; stages 0-2 hold none.
    fid = _cal()
    assert float(memory.zero3_gather_bytes(jnp.float64(218e6), 3.0, 2.0, fid)) == pytest.approx(6 * 218e6)
    assert float(memory.zero3_gather_bytes(jnp.float64(218e6), 2.0, 2.0, fid)) == 0.0
    # DeepSpeed: at most stage3_max_live_parameters (1e9) gathered at once, 16-bit: a 530B layer of
    # 12 h^2 = 5.03e9 parameters (h = 20480) holds 2 GB, not two layers (gradients go through its bucket).
    layer = 12 * 20480.0 ** 2
    assert float(memory.zero3_gather_bytes(jnp.float64(layer), 3.0, 2.0, fid, 1e9)) == pytest.approx(2e9)
    assert float(memory.zero3_gather_bytes(jnp.float64(1e8), 3.0, 2.0, fid, 1e9)) == pytest.approx(2 * 2 * 1e8)
    # PyTorch DDP (gradient_as_bucket_view=False): the buckets copy every 16-bit gradient, ZeRO-0 only;
    # DeepSpeed: reduce_bucket_size 5e8 elements = 1 GB of 16-bit buckets.
    assert float(memory.dp_bucket_bytes(jnp.float64(7e9), 0.0, 0.0, 1.0, fid)) == pytest.approx(14e9)
    assert float(memory.dp_bucket_bytes(jnp.float64(7e9), 1.0, 0.0, 1.0, fid)) == 0.0
    assert float(memory.dp_bucket_bytes(jnp.float64(7e9), 3.0, 5e8, 0.0, fid)) == pytest.approx(1e9)


def test_nccl_context_fragmentation():
    # NCCL: NCCL_BUFFSIZE 4 MiB x 32 channels a communicator (NCCL docs; device.h MAXCHANNELS):
    # 5 groups = 640 MiB. CUDA context 723 MiB. GMLake: 15% of reserved memory fragmented, so
    # 85 GB allocated and freed within a step reserve 100 GB (15 GB fragmentation).
    fid = _cal()
    assert float(memory.nccl_bytes(5.0, fid)) == pytest.approx(640 * MiB)
    assert float(memory.context_bytes(fid)) == pytest.approx(723 * MiB)
    assert float(memory.fragmentation_bytes(jnp.float64(85e9), fid)) == pytest.approx(15e9)
    seed = dse.Fidelity.seed()
    assert float(memory.nccl_bytes(5.0, seed) + memory.context_bytes(seed)
                 + memory.fragmentation_bytes(jnp.float64(85e9), seed)) == 0.0


def test_report_breaks_other_memory_down_and_adds_up():
    # GPT-3 175B on 1,024 H100, t = 8, p = 8, d = 16, ZeRO-1, SP + selective (calibrated): the first
    # stage is the fullest; other = SP gather + NCCL (3 groups: tp, pp, dp) + context + fragmentation.
    model, cl = presets.load_model("gpt3-175b"), presets.load_cluster("h100-sxm")
    plan = dse.Plan.make(tp=8, pp=8, mbs=1, gbs=1536)
    r = dse.evaluate(model, cl, plan, "calibrated")
    parts = r.memory_dict()
    buffers = sum(float(parts[k]) for k in ("logits", "tp_buffer", "dp_buffer", "nccl", "context", "fragmentation"))
    assert float(r.other_bytes) == pytest.approx(buffers, rel=1e-12)
    states = float(r.weights_bytes + r.grads_bytes + r.optimizer_bytes + r.activations_bytes)
    assert float(r.memory_bytes) == pytest.approx(states + buffers, rel=1e-12)
    assert float(r.tp_buffer_bytes) == pytest.approx(2 * 2048 * 12288)
    assert float(r.nccl_bytes) == pytest.approx(3 * 32 * 4 * MiB)            # tp 8, pp 8, dp 16
    assert float(r.logits_bytes) == 0.0                                      # first stage: no output layer
    # fragmentation: 15% of what is allocated and freed within a step (activations and buffers), not of
    # the states allocated once (GMLake, memory.fragmentation_bytes)
    transient = float(r.activations_bytes + r.tp_buffer_bytes + r.dp_buffer_bytes + r.logits_bytes)
    assert float(r.fragmentation_bytes) == pytest.approx(transient * 0.15 / 0.85, rel=1e-12)
    # seed mode: none of them (seed 000 "Not modeled: temporary buffers and fragmentation")
    s = dse.evaluate(model, cl, plan, "seed")
    assert float(s.other_bytes) == 0.0 and float(s.memory_bytes) == pytest.approx(
        float(s.weights_bytes + s.grads_bytes + s.optimizer_bytes + s.activations_bytes), rel=1e-12)


def test_last_stage_with_the_logits_can_be_the_fullest():
    # p = 2, m = 1 microbatch: both stages hold one microbatch of L/2 layers; the last adds the
    # fp32 logits of a 256K vocabulary (s b V / t x 6 bytes = 12.9 GB at s = 8192, t = 1), so it
    # is the fullest rank and the report shows its logits.
    model = presets.load_model("llama3-8b").replace(seq=8192, vocab=262144)
    cl = presets.load_cluster("h100-sxm").replace(gpus=2)
    plan = dse.Plan.make(tp=1, pp=2, mbs=1, gbs=1)
    r = dse.evaluate(model, cl, plan, "calibrated")
    assert float(r.logits_bytes) == pytest.approx(6 * 8192 * 262144, rel=1e-12)
