"""Latency terms count only calls that happen (issue 17, defect 1)."""

import jax.numpy as jnp
import pytest

import dse
from dse.equations import traffic
from dse.inputs import presets
from dse.inputs.fidelity import resolve


def test_empty_dp_group_pays_no_alpha():
    # alpha-beta model: alpha a step of a call that happens. A dense model's expert-DP group
    # holds 0 parameters, so it sends nothing and has no steps (before the fix: 172,720 steps
    # for Llama 3 70B ZeRO-3 on 1,024 H100 at tp 8, B 1024: 0.41 s of phantom latency).
    v = traffic.dp(jnp.float64(0.0), 128.0, 3.0, 80.0, 8.0, 1.0, 0.0)
    assert float(v["steps"]) == 0.0 and float(v["calls"]) == 0.0 and float(v["bytes"]) == 0.0


def test_single_stage_pipeline_pays_no_alpha():
    # p = 1 has no stage boundary: no send/recv, no latency (before the fix: 2 m v steps).
    m = presets.load_model("llama3-8b")
    v = traffic.pp(m, 1.0, 1.0, jnp.float64(1.0), 1.0, 16.0, 1.0)
    assert float(v["steps"]) == 0.0


def test_dense_dp_wire_is_bytes_over_rate_plus_its_own_alpha():
    # Hand-derived: Llama 3 70B, tp 8, pp 1, ZeRO-1, one reduce-scatter + one all-gather a step
    # over d = 128 ranks across the scale-out network: bytes / (B_out x bw_out_efficiency)
    # + 2 calls x 127 ring steps x alpha_out. Before the fix the empty expert group added
    # another 254 x alpha_out (0.61 ms).
    model, cl = presets.load_model("llama3-70b"), presets.load_cluster("h100-sxm")
    fid = resolve("calibrated")
    r = dse.evaluate(model, cl, dse.Plan.make(tp=8, pp=1, mbs=1, gbs=512, zero=1), fid)
    rate = float(cl.bw_out_bytes_per_s * fid.bw_out_efficiency)
    want = float(r.traffic_bytes.dp) / rate + 2 * 127 * float(cl.alpha_out_s)
    assert float(r.wire_s.dp) == pytest.approx(want, rel=1e-9)


def test_zero3_collectives_a_layer_count_their_ring_steps():
    # Hand-derived: ZeRO-3 over d = 768 ranks, 96 layers, one microbatch: a forward and a
    # backward weight gather and one gradient reduce-scatter a layer. One collective each (FSDP's
    # flat unit): 3 x 767 x 96 = 220,896 ring steps. DeepSpeed 2021 (stack deepspeed-megatron:
    # one all-gather a module, 6 in Megatron's GPT layer; one reduce-scatter a parameter tensor,
    # 12): (2 x 6 + 12) x 767 x 96 = 1,767,168. The bytes do not change.
    args = (jnp.float64(1.8e9), 768.0, 3.0, 96.0, 1.0, 0.0, 1.0)
    unit, ds = traffic.dp(*args), traffic.dp(*args, 2.0, 6.0, 12.0)
    assert float(unit["steps"]) == 220_896 and float(ds["steps"]) == 1_767_168
    assert float(unit["calls"]) == 3 * 96 and float(ds["calls"]) == 24 * 96   # collectives a step
    assert float(ds["bytes"]) == float(unit["bytes"])
    # per-rank tensor lists (DeepSpeed 2021): d copies a collective, 2,304 x 768 = 1,769,472 a step
    assert float(traffic.dp(*args, 2.0, 6.0, 12.0, 1.0)["copies"]) == 2304 * 768 and float(ds["copies"]) == 0.0
    # ZeRO-1/2 keep their bucketed pair of collectives whatever a layer's count
    z1 = traffic.dp(jnp.float64(1.8e9), 768.0, 1.0, 96.0, 1.0, 0.0, 1.0, 2.0, 6.0, 12.0)
    assert float(z1["steps"]) == 2 * 767


def test_deepspeed_zero3_pays_alpha_for_every_collective():
    # Narayanan et al. 2021 Table 2's ZeRO-3 row at 768 GPUs (GPT 174.6B, 96 layers, batch 1536,
    # microbatch 2: one microbatch a step) on the stack's collectives: the DP wire time exceeds the
    # one-collective-a-layer plan's by exactly (24 - 3) x 767 x 96 ring steps x alpha_out (alpha-beta)
    # plus (24 - 3) x 96 collectives x 768 per-rank copies x the fitted copy time.
    from dse.inputs import stacks

    model = presets.load_model("gpt3-175b")
    cl = presets.load_cluster("a100-80gb", gpus=768)
    fields = stacks.plan_fields("deepspeed-megatron")
    assert (fields["zero3_gather_calls"], fields["zero3_reduce_calls"]) == (6.0, 12.0)
    fid = resolve("calibrated")
    plan = dse.Plan.make(tp=1, pp=1, mbs=2, gbs=1536, **fields)
    ds = dse.evaluate(model, cl, plan, fid)
    unit = dse.evaluate(model, cl, plan.replace(zero3_gather_calls=0.0, zero3_reduce_calls=0.0), fid)
    assert fields["zero3_rank_copies"] == 1.0 and float(fid.rank_copy_us) > 0
    extra = (24 - 3) * 767 * 96 * float(cl.alpha_out_s) + (24 - 3) * 96 * 768 * float(fid.rank_copy_us) * 1e-6
    assert float(ds.wire_s.dp - unit.wire_s.dp) == pytest.approx(extra, rel=1e-9)
    assert float(ds.traffic_bytes.dp) == float(unit.traffic_bytes.dp)
