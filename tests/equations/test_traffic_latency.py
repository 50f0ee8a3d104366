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
