"""Seed 001's operator arithmetic: DP all-reduce volume, bubble fractions."""

import jax.numpy as jnp
import pytest

import dse
from dse.inputs import presets
from dse.equations import collectives as col, schedule, traffic


def test_7b_dp_allreduce_28gb_and_0p7s():
    # seed 001: 7B params, bf16 grads = 14 GB buffer; ring all-reduce ~2x = 28 GB per rank;
    # at 40 GB/s that is 0.7 s of wire time. d = 1024 ("any reasonably large ring").
    vol = traffic.dp(jnp.float64(7e9), jnp.float64(1024), jnp.float64(0), jnp.float64(1))
    assert float(vol["bytes"]) == pytest.approx(28e9, rel=1e-3)
    # the wire time dse computes for those bytes at 40 GB/s (alpha-beta model, latency off as in the seed)
    t = col.wire_time(vol["bytes"], vol["calls"], col.ring_steps(col.ALL_REDUCE, 1024.0), 40e9, 0.0, 0.0)
    assert float(t) == pytest.approx(0.7, rel=1e-3)


def test_bubble_p4_m16_is_3_16():
    # seed 001: P = 4, M = 16 -> 3/16, about 19 percent.
    assert float(schedule.bubble_fraction(4.0, 16.0, 1.0)) == pytest.approx(3 / 16)


def test_bubble_p4_m8_wastes_27_percent():
    # seed 001: "Four stages with eight microbatches wastes about 27 percent";
    # share of the step (p-1)/(m+p-1) = 3/11 = 27.3% (GPipe). With zero comm the Report's
    # bubble_share equals it exactly.
    model = presets.load_model("llama3-8b").replace(seq=2048)
    cluster = presets.load_cluster("seed").replace(gpus=4, bw_up_bytes_per_s=1e30, bw_out_bytes_per_s=1e30)
    plan = dse.Plan.make(tp=1, pp=4, mbs=1, gbs=8, zero=0)
    r = dse.evaluate(model, cluster, plan)
    assert float(r.microbatches) == 8
    assert float(r.bubble_share) == pytest.approx(3 / 11, rel=1e-6)
    assert 0.27 <= float(r.bubble_share) <= 0.275
